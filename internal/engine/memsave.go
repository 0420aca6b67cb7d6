package engine

import (
	"context"
	"errors"
	"sync"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// memorySave copies the memory gpucr saves itself (large runs, a GPU process's staged
// device memory) out of the frozen tree, on all cores. It starts as soon as the target says
// the tree is stopped — CRIU has seized it, or the container is paused — and so runs beside
// CRIU's dump of everything else instead of after it; the commit waits for it. A target
// that cannot tell has it started by the commit.
type memorySave struct {
	run func(ctx context.Context) ([]image.File, error)

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
	done   chan struct{}
	timer  Timer // its own: it runs beside the dump's phases, so it journals no phase
	copied []image.File
	err    error
}

// newMemorySave prepares the save of saved into stage's mem/ (or into s, streamed), into the
// memory res reserved (nil for none).
func (e *Engine) newMemorySave(ctx context.Context, stage *image.Staging, saved []memfill.Range, s *chunked.Stream, res *memfill.Reserve) *memorySave {
	m := &memorySave{done: make(chan struct{}), timer: Timer{r: e.reporter()}}
	m.ctx, m.cancel = context.WithCancel(ctx)
	switch {
	case len(saved) == 0: // nothing to save: no phase
	case s != nil:
		m.run = func(ctx context.Context) ([]image.File, error) {
			return nil, memfill.SaveTo(ctx, saved, func(path string) (criuimg.Receiver, error) { return receiver(s.Create(path)) })
		}
	default:
		m.run = func(ctx context.Context) ([]image.File, error) { return memfill.Save(ctx, stage.Dir(), saved, res) }
	}
	return m
}

// start begins the save, once; the tree must be frozen.
func (m *memorySave) start() {
	m.once.Do(func() {
		if m.run == nil {
			close(m.done)
			return
		}
		go func() {
			defer close(m.done)
			m.err = m.timer.RunCounted(m.ctx, PhaseMemorySave, func(ctx context.Context) (err error) {
				m.copied, err = m.run(ctx)
				return err
			})
		}()
	})
}

// wait starts the save if the target never said the tree froze, waits for it, and adds its
// phase to t.
func (m *memorySave) wait(t *Timer) ([]image.File, error) {
	m.start()
	<-m.done
	t.Phases = append(t.Phases, m.timer.Phases...)
	m.timer.Phases = nil
	return m.copied, m.err
}

// failed stops a save that started beside a dump that failed, and returns the error it
// failed with on its own (nil if it never started, or was only stopped): on the same full
// disk, say, it names the cause. It never lets the save run on: copying the rest, or
// uploading it, would only keep the workload stopped on its GPUs before the rollback
// resumes them (review).
func (m *memorySave) failed() error {
	m.stop()
	if m.err != nil && m.ctx.Err() != nil && errors.Is(m.err, context.Canceled) {
		return nil
	}
	return m.err
}

// stop abandons a save that is no longer wanted (the dump failed) and waits until it
// touches neither the tree nor the staged image.
func (m *memorySave) stop() {
	m.cancel()
	m.once.Do(func() { close(m.done) }) // never started: nothing to wait for
	<-m.done
}
