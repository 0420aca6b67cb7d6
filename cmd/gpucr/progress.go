package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/term"
)

// progress shows each long phase with a running clock on a terminal; elsewhere it is silent
// so that logs and pipes get only results.
type progress struct {
	w    io.Writer
	mu   sync.Mutex
	stop chan struct{}
	done chan struct{}
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return &progress{}
	}
	return &progress{w: w}
}

func (p *progress) Start(phase string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.halt()
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func(stop, done chan struct{}) {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			fmt.Fprintf(p.w, "\r\033[K  %s %.1fs", phase, time.Since(start).Seconds())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}(p.stop, p.done)
}

func (p *progress) Done(phase string, d time.Duration) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.halt()
	fmt.Fprintf(p.w, "\r\033[K  %s %s\n", phase, seconds(d))
}

func (p *progress) halt() {
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
}
