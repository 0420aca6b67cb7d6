package chunked

import (
	"fmt"
	"time"
)

// SetLeaseTiming shortens the lease timing for a test and restores it at cleanup.
func SetLeaseTiming(cleanup func(func()), refresh, ttl time.Duration) {
	r, l, w := leaseRefresh, leaseTTL, writerWait
	leaseRefresh, leaseTTL, writerWait = refresh, ttl, 3*ttl
	cleanup(func() { leaseRefresh, leaseTTL, writerWait = r, l, w })
}

// LeaseName names a lease of kind as a gpucr with pid and start on host, in scope (BOOT.NS),
// would write it; Host and Scope are this gpucr's.
func LeaseName(kind, host, scope string, pid int, start uint64) string {
	return fmt.Sprintf("%s-%s-%s-%d-%d-00", kind, host, scope, pid, start)
}

var (
	Host  = hostField
	Scope = pidScope
)
