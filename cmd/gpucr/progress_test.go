package main

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/meter"
	"github.com/gpucr/gpucr/internal/testutil"
)

// fakeClock is a progress's clock that moves only when told.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func linesOf(b *bytes.Buffer) []string       { return strings.Split(strings.TrimSpace(b.String()), "\n") }
func (p *progress) tickNow()                 { p.mu.Lock(); p.line(); p.mu.Unlock() }
func startFake(p *progress, c *fakeClock)    { p.now = c.now }

// Off a terminal, a long phase logs a line with its bytes, rate and time left once every
// interval, and its end; a short phase logs nothing.
func TestProgressLinesEveryInterval(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{}
	p := newProgress(&out, false, 5*time.Second, false)
	startFake(p, clock)

	p.Start("gpu-lock")
	clock.advance(time.Second)
	p.tickNow()
	p.Done("gpu-lock", time.Second)
	if out.Len() != 0 {
		t.Fatalf("a phase shorter than the interval logged:\n%s", out.String())
	}

	c := new(meter.Counter)
	p.StartBytes("memory-save", c)
	c.SetTotal(100 << 20)
	c.Add(25 << 20)
	clock.advance(4 * time.Second)
	p.tickNow()
	if out.Len() != 0 {
		t.Fatalf("logged before the interval:\n%s", out.String())
	}
	clock.advance(time.Second)
	p.tickNow()
	clock.advance(time.Second)
	p.tickNow() // within the next interval: nothing
	c.Add(25 << 20)
	clock.advance(4 * time.Second)
	p.tickNow()
	p.Done("memory-save", 10*time.Second)
	got := linesOf(&out)
	want := []string{
		`msg=progress phase=memory-save elapsed=5s done="25 MiB" total="100 MiB" percent=25 rate="5.0 MiB/s" eta=15s`,
		`msg=progress phase=memory-save elapsed=10s done="50 MiB" total="100 MiB" percent=50 rate="5.0 MiB/s" eta=10s`,
		`msg="phase done" phase=memory-save took=10s done="50 MiB" rate="5.0 MiB/s"`,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for i := range want {
		if !strings.HasPrefix(got[i], "time=") || !strings.Contains(got[i], " level=INFO "+want[i]) {
			t.Errorf("line %d:\n%s\nwant it to end with\nlevel=INFO %s", i, got[i], want[i])
		}
	}
}

// Where only time is known (the GPU driver's checkpoint) the line has the clock alone, and
// of nested phases the innermost is shown.
func TestProgressLinesClockAndNesting(t *testing.T) {
	var out bytes.Buffer
	clock := &fakeClock{}
	p := newProgress(&out, false, 5*time.Second, false)
	startFake(p, clock)
	p.Start("gpu-checkpoint")
	clock.advance(6 * time.Second)
	p.tickNow()
	p.Done("gpu-checkpoint", 6*time.Second)
	if got := out.String(); !strings.Contains(got, "msg=progress phase=gpu-checkpoint elapsed=6s\n") ||
		!strings.Contains(got, `msg="phase done" phase=gpu-checkpoint took=6s`+"\n") {
		t.Errorf("clock lines:\n%s", got)
	}
	out.Reset()

	p.Start("criu-restore")
	c := new(meter.Counter)
	p.StartBytes("memory-fill", c)
	c.Add(8 << 20) // no total yet: no percent, no time left
	clock.advance(5 * time.Second)
	p.tickNow()
	p.Done("memory-fill", 5*time.Second)
	clock.advance(5 * time.Second)
	p.tickNow()
	p.Done("criu-restore", 10*time.Second)
	got := linesOf(&out)
	if len(got) != 4 || !strings.Contains(got[0], `phase=memory-fill elapsed=5s done="8.0 MiB" rate="1.6 MiB/s"`) ||
		strings.Contains(got[0], "eta") || !strings.Contains(got[2], "phase=criu-restore elapsed=10s") {
		t.Errorf("nested phases:\n%s", out.String())
	}
}

// --quiet and an interval of 0 show nothing; with a short interval the ticker logs by
// itself.
func TestProgressQuietAndTicker(t *testing.T) {
	for _, p := range []*progress{newProgress(new(bytes.Buffer), false, time.Millisecond, true), newProgress(new(bytes.Buffer), false, 0, false)} {
		if !p.off() {
			t.Errorf("progress %+v shows something", p)
		}
		p.StartBytes("memory-save", new(meter.Counter))
		time.Sleep(5 * time.Millisecond)
		p.Done("memory-save", 5*time.Millisecond)
		if b := p.w.(*bytes.Buffer); b.Len() != 0 {
			t.Errorf("quiet progress printed %q", b.String())
		}
	}

	var out testutil.LockedBuffer
	p := newProgress(&out, false, 10*time.Millisecond, false)
	c := new(meter.Counter)
	p.StartBytes("memory-save", c)
	c.SetTotal(1 << 30)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "msg=progress phase=memory-save") && time.Now().Before(deadline) {
		c.Add(1 << 20)
		time.Sleep(5 * time.Millisecond)
	}
	p.Done("memory-save", time.Second)
	if !strings.Contains(out.String(), `total="1.0 GiB"`) {
		t.Errorf("the ticker logged no progress line:\n%s", out.String())
	}
	if p.stop != nil {
		t.Error("the ticker runs on with no phase")
	}
}

// On a terminal a phase that counts bytes draws a bar with them, and its end a line with
// its time and how much it moved.
func TestProgressBar(t *testing.T) {
	var out testutil.LockedBuffer
	p := newProgress(&out, false, 0, false)
	p.bars = true
	c := new(meter.Counter)
	p.StartBytes("memory-save", c)
	c.SetTotal(64 << 20)
	c.Add(16 << 20)
	p.mu.Lock()
	p.draw()
	p.mu.Unlock()
	p.Done("memory-save", 2*time.Second)
	got := out.String()
	for _, want := range []string{"memory-save", "(16/64 MiB", "25%", "\r\033[K  memory-save 2.00s  16 MiB at 8.0 MiB/s\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in the terminal's output %q", want, got)
		}
	}
}

// A negative --progress-every is a usage error, before the verb runs: it was taken silently.
func TestNegativeProgressEveryIsRefused(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"ls", "--progress-every", "-1s", t.TempDir()}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--progress-every -1s") {
		t.Errorf("exit %d, want %d naming the flag: %s", code, exitUsage, stderr.String())
	}
}
