package store

import (
	"testing"
	"time"
)

// ShortenStallTimeout makes the S3 clients the test opens give a transfer up after d
// without a byte moved.
func ShortenStallTimeout(t *testing.T, d time.Duration) {
	old := stallTimeout
	stallTimeout = d
	t.Cleanup(func() { stallTimeout = old })
}
