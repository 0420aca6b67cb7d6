package testutil

import (
	"syscall"
	"testing"
)

// WithFileLimit runs f with this process's descriptor limit (RLIMIT_NOFILE) lowered to n,
// and puts the limit back before it returns: code that holds one descriptor per file must
// fail under it where a file set grows.
func WithFileLimit(t testing.TB, n uint64, f func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	f()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
}
