package chunked

import "time"

// SetLeaseTiming shortens the lease timing for a test and restores it at cleanup.
func SetLeaseTiming(cleanup func(func()), refresh, ttl time.Duration) {
	r, l, w := leaseRefresh, leaseTTL, writerWait
	leaseRefresh, leaseTTL, writerWait = refresh, ttl, 3*ttl
	cleanup(func() { leaseRefresh, leaseTTL, writerWait = r, l, w })
}
