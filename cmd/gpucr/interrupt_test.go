package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// A verb stopped by a signal says so first, and only then what it was doing when the
// cancellation reached it; other errors, and a cancellation no signal caused, stay as they
// are (a hostile test met "gpucr: context canceled" after a Ctrl-C).
func TestInterruptedVerbsSaySo(t *testing.T) {
	cancelled := fmt.Errorf("store memory pages: %w", context.Canceled)
	for _, c := range []struct {
		err  error
		sig  os.Signal
		want string
	}{
		{cancelled, syscall.SIGINT, "interrupted by SIGINT: store memory pages: context canceled"},
		{cancelled, syscall.SIGTERM, "interrupted by SIGTERM: store memory pages: context canceled"},
		{cancelled, nil, "store memory pages: context canceled"},
		{errors.New("disk full"), syscall.SIGINT, "disk full"},
	} {
		if got := explainInterrupt(c.err.Error(), c.err, c.sig); got != c.want {
			t.Errorf("explainInterrupt(%q, %v) = %q, want %q", c.err, c.sig, got, c.want)
		}
	}
}
