// Package interrupt turns SIGINT and SIGTERM into context cancellation, and starts child
// processes that a terminal's Ctrl-C cannot kill, so gpucr alone decides how to stop them.
package interrupt

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

var (
	mu       sync.Mutex
	signals  = make(chan os.Signal, 1)
	caught   = []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	active   bool      // a Context is listening
	received os.Signal // the signal a Context was cancelled by, if any
)

// Received is the signal that cancelled a Context, or nil if none did.
func Received() os.Signal {
	mu.Lock()
	defer mu.Unlock()
	return received
}

// Context is cancelled on the first SIGINT or SIGTERM. The caller must call stop.
func Context(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	mu.Lock()
	active = true
	signal.Notify(signals, caught...)
	mu.Unlock()
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-signals:
			mu.Lock()
			received = sig
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	return ctx, func() {
		mu.Lock()
		active = false
		signal.Stop(signals)
		mu.Unlock()
		close(done)
		cancel()
	}
}

// StartImmune runs start, which must fork a child, while SIGINT is ignored: an ignored
// signal stays ignored across exec, so the Ctrl-C that the terminal sends to its whole
// process group does not kill CRIU halfway through freezing or dumping the workload.
func StartImmune(start func() error) error {
	mu.Lock()
	defer mu.Unlock()
	signal.Ignore(syscall.SIGINT)
	err := start()
	if active {
		signal.Notify(signals, caught...)
	} else {
		signal.Reset(syscall.SIGINT)
	}
	return err
}
