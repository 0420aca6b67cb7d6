package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gpucr/gpucr/internal/meter"
)

// progress shows an operation's long phases on stderr, never on stdout (which carries
// results and --json). On a terminal: a bar with bytes, rate and time left for a phase that
// counts its bytes, a running clock for one where only time is known (the GPU driver's
// checkpoint), and a line with each phase's time as it ends. Elsewhere: a log line every
// interval while a phase runs, so that a log shows a long checkpoint is alive, and none for
// a phase shorter than that. It is the engine's ByteReporter, and push's and pull's.
type progress struct {
	w     io.Writer
	bars  bool          // a terminal: draw bars
	every time.Duration // off a terminal, between lines (0: no lines)
	now   func() time.Time
	log   *slog.Logger

	mu     sync.Mutex
	active []*shownPhase // innermost last: memory-fill runs within criu-restore
	drawn  *shownPhase   // whose bar is on the terminal's line
	stop   chan struct{} // the ticker's, while a phase runs
	ended  chan struct{}
}

// shownPhase is one phase being shown.
type shownPhase struct {
	name  string
	c     *meter.Counter // nil: only time is known
	start time.Time
	bar   *progressbar.ProgressBar
	total int64     // the bar's, once the counter knew it
	last  time.Time // of the latest line off a terminal
	lines int
}

// barTick is how often a bar is redrawn.
const barTick = 150 * time.Millisecond

// newProgress shows progress on w: bars on a terminal, elsewhere a line every interval
// (none when every is 0). quiet shows nothing anywhere.
func newProgress(w io.Writer, terminal bool, every time.Duration, quiet bool) *progress {
	p := &progress{w: w, bars: terminal, every: every, now: time.Now}
	switch {
	case quiet:
		p.bars = false
	case !p.bars && every > 0:
		p.log = slog.New(slog.NewTextHandler(w, nil))
	}
	return p
}

func (p *progress) off() bool { return !p.bars && p.log == nil }

// Start shows a phase where only time is known.
func (p *progress) Start(phase string) { p.StartBytes(phase, nil) }

// StartBytes shows a phase whose bytes c counts.
func (p *progress) StartBytes(phase string, c *meter.Counter) {
	if p.off() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &shownPhase{name: phase, c: c, start: p.now()}
	s.last = s.start
	p.active = append(p.active, s)
	if p.bars {
		p.draw()
	}
	if p.stop == nil {
		period := barTick
		if !p.bars {
			period = max(p.every/2, time.Millisecond)
		}
		p.stop, p.ended = make(chan struct{}), make(chan struct{})
		go p.tick(period, p.stop, p.ended)
	}
}

// Done ends the phase: on a terminal a line says how long it took (and how much it
// moved); off a terminal, only a phase that logged progress logs its end.
func (p *progress) Done(phase string, d time.Duration) {
	if p.off() {
		return
	}
	p.mu.Lock()
	i := len(p.active) - 1
	for i >= 0 && p.active[i].name != phase {
		i--
	}
	if i < 0 {
		p.mu.Unlock()
		return
	}
	s := p.active[i]
	p.active = append(p.active[:i], p.active[i+1:]...)
	done, _ := s.c.Load()
	switch {
	case p.bars:
		if p.drawn != nil {
			p.drawn = nil
			fmt.Fprint(p.w, "\r\033[K")
		}
		moved := ""
		if done > 0 {
			moved = fmt.Sprintf("  %s at %s/s", bytesHuman(uint64(done)), bytesHuman(uint64(rate(done, d))))
		}
		fmt.Fprintf(p.w, "  %s %s%s\n", s.name, seconds(d), moved)
		p.draw()
	case s.lines > 0:
		args := []any{"phase", s.name, "took", d.Round(time.Millisecond)}
		if s.c != nil {
			args = append(args, "done", bytesHuman(uint64(done)), "rate", bytesHuman(uint64(rate(done, d)))+"/s")
		}
		p.log.Info("phase done", args...)
	}
	var stop, ended chan struct{}
	if len(p.active) == 0 {
		stop, ended, p.stop = p.stop, p.ended, nil
	}
	p.mu.Unlock()
	if stop != nil {
		close(stop) // outside the lock: a tick may be waiting for it
		<-ended
	}
}

func (p *progress) tick(period time.Duration, stop, ended chan struct{}) {
	defer close(ended)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			p.mu.Lock()
			if p.bars {
				p.draw()
			} else {
				p.line()
			}
			p.mu.Unlock()
		}
	}
}

// draw shows the innermost phase: a bar once its total is known, a clock (with the bytes
// counted, if any) until then.
func (p *progress) draw() {
	if len(p.active) == 0 {
		return
	}
	s := p.active[len(p.active)-1]
	done, total := s.c.Load()
	if s.bar == nil || (total > 0 && s.total == 0) {
		s.bar, s.total = newBar(p.w, s.name, s.c != nil, total), total
		p.drawn = nil
	}
	if p.drawn != s {
		if p.drawn != nil {
			fmt.Fprint(p.w, "\r\033[K")
		}
		p.drawn = s
	}
	if s.c == nil {
		_ = s.bar.RenderBlank()
		return
	}
	if s.total > 0 {
		done = min(done, s.total)
	}
	_ = s.bar.Set64(done) // draws it
}

// newBar is a bar of total bytes, or a clock when total is unknown (showing the bytes done
// when they are counted).
func newBar(w io.Writer, name string, counted bool, total int64) *progressbar.ProgressBar {
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("  " + name),
		progressbar.OptionUseANSICodes(true),
		progressbar.OptionSetSpinnerChangeInterval(0), // drawn by the ticker, not a goroutine of its own
		progressbar.OptionSetElapsedTime(true),
	}
	if counted {
		opts = append(opts, progressbar.OptionShowBytes(true), progressbar.OptionShowCount(),
			progressbar.OptionShowTotalBytes(true), progressbar.OptionUseIECUnits(true))
	}
	if total <= 0 {
		return progressbar.NewOptions64(-1, opts...)
	}
	return progressbar.NewOptions64(total, append(opts, progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30))...)
}

// line logs the innermost phase's progress once every interval.
func (p *progress) line() {
	if len(p.active) == 0 {
		return
	}
	s := p.active[len(p.active)-1]
	now := p.now()
	if now.Sub(s.last) < p.every {
		return
	}
	s.last = now
	s.lines++
	elapsed := now.Sub(s.start)
	args := []any{"phase", s.name, "elapsed", round(elapsed)}
	if s.c != nil {
		done, total := s.c.Load()
		args = append(args, "done", bytesHuman(uint64(done)))
		r := rate(done, elapsed)
		if total > 0 {
			args = append(args, "total", bytesHuman(uint64(total)), "percent", 100*done/total)
		}
		args = append(args, "rate", bytesHuman(uint64(r))+"/s")
		if total > 0 && r > 0 {
			args = append(args, "eta", round(time.Duration(float64(total-done)/float64(r)*float64(time.Second))))
		}
	}
	p.log.Info("progress", args...)
}

// rate is bytes per second over d.
func rate(bytes int64, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(float64(bytes) / d.Seconds())
}

func round(d time.Duration) time.Duration { return d.Round(time.Second) }

// isTerminal says whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressFlush bounds how long gpucr waits, as it exits, for its last progress lines to
// be taken by stderr's reader.
const progressFlush = 2 * time.Second

// lossyWriter writes to w from a goroutine of its own, and drops what does not fit its
// queue: progress is never worth holding a checkpoint for, and a stderr nobody read (a
// full pipe, a terminal paused with Ctrl-S) held the engine at its next phase with the
// workload frozen (hostile test). Once w fails (a reader gone), the rest is dropped.
type lossyWriter struct {
	mu     sync.Mutex
	queue  chan []byte
	closed bool
	done   chan struct{}
}

func newLossyWriter(w io.Writer) *lossyWriter {
	l := &lossyWriter{queue: make(chan []byte, 256), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		broken := false
		for b := range l.queue {
			if !broken {
				_, err := w.Write(b)
				broken = err != nil
			}
		}
	}()
	return l
}

func (l *lossyWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		select {
		case l.queue <- bytes.Clone(b):
		default:
		}
	}
	return len(b), nil
}

// Close writes what is queued, waiting at most limit for the reader.
func (l *lossyWriter) Close(limit time.Duration) {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	l.mu.Unlock()
	select {
	case <-l.done:
	case <-time.After(limit):
	}
}
