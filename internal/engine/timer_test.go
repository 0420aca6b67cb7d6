package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/meter"
)

// heard records what a Reporter is told; counts marks it a ByteReporter.
type heard struct {
	events []string
	c      *meter.Counter
}

func (h *heard) Start(phase string)                 { h.events = append(h.events, "start "+phase) }
func (h *heard) Done(phase string, _ time.Duration) { h.events = append(h.events, "done "+phase) }

type counting struct{ *heard }

func (c counting) StartBytes(phase string, m *meter.Counter) {
	c.events = append(c.events, "bytes "+phase)
	c.c = m
}

// A counted phase hands a ByteReporter the counter its work counts into; a Reporter that
// shows no bytes hears of it as of any phase.
func TestRunCountedHandsTheCounterToAByteReporter(t *testing.T) {
	fail := errors.New("fail")
	h := &heard{}
	tm := &Timer{r: counting{h}}
	err := tm.RunCounted(context.Background(), "memory-save", func(ctx context.Context) error {
		meter.From(ctx).SetTotal(10)
		meter.From(ctx).Add(4)
		return fail
	})
	if !errors.Is(err, fail) {
		t.Fatalf("err %v, want the phase's", err)
	}
	if done, total := h.c.Load(); done != 4 || total != 10 {
		t.Errorf("the reporter's counter says %d of %d, want 4 of 10", done, total)
	}
	if want := []string{"bytes memory-save", "done memory-save"}; !slices.Equal(h.events, want) {
		t.Errorf("heard %q, want %q", h.events, want)
	}
	if len(tm.Phases) != 1 || tm.Phases[0].Name != "memory-save" {
		t.Errorf("phases %+v, want the one counted", tm.Phases)
	}

	plain := &heard{}
	tm = &Timer{r: plain}
	_ = tm.RunCounted(context.Background(), "memory-fill", func(ctx context.Context) error {
		meter.From(ctx).Add(1) // counted where no one shows it: harmless
		return nil
	})
	_ = tm.Run("gpu-restore", func() error { return nil })
	if want := []string{"start memory-fill", "done memory-fill", "start gpu-restore", "done gpu-restore"}; !slices.Equal(plain.events, want) {
		t.Errorf("heard %q, want %q", plain.events, want)
	}
}
