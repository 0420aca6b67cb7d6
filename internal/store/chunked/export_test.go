package chunked

import (
	"fmt"
	"time"
)

// SetLeaseTiming shortens the lease timing for a test and restores it at cleanup.
func SetLeaseTiming(cleanup func(func()), refresh, ttl time.Duration) {
	r, l, w, d := leaseRefresh, leaseTTL, writerWait, leaseDropWait
	leaseRefresh, leaseTTL, writerWait, leaseDropWait = refresh, ttl, 3*ttl, ttl
	cleanup(func() { leaseRefresh, leaseTTL, writerWait, leaseDropWait = r, l, w, d })
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

// MaxFiles is how many files a manifest object may list.
const MaxFiles = maxFiles
