// Package meter counts the bytes a long phase moves, so that a progress display can show
// them without the code doing the work knowing of any display.
package meter

import (
	"context"
	"sync/atomic"
)

// Counter holds a phase's bytes done and expected. Its methods are safe from many
// goroutines at once, and a nil Counter counts nothing, so code can count unconditionally.
type Counter struct {
	done, total atomic.Int64
}

// SetTotal says how many bytes the phase will move; 0 is unknown.
func (c *Counter) SetTotal(n int64) {
	if c != nil {
		c.total.Store(n)
	}
}

// Add counts n more bytes done.
func (c *Counter) Add(n int64) {
	if c != nil {
		c.done.Add(n)
	}
}

// SetDone says how many bytes are done, for work that counts them itself.
func (c *Counter) SetDone(n int64) {
	if c != nil {
		c.done.Store(n)
	}
}

// Load returns the bytes done and the total (0 when unknown).
func (c *Counter) Load() (done, total int64) {
	if c == nil {
		return 0, 0
	}
	return c.done.Load(), c.total.Load()
}

type key struct{}

// With returns ctx carrying c: the work ctx reaches counts into c.
func With(ctx context.Context, c *Counter) context.Context {
	return context.WithValue(ctx, key{}, c)
}

// From is the Counter ctx carries, or nil (which counts nothing).
func From(ctx context.Context) *Counter {
	c, _ := ctx.Value(key{}).(*Counter)
	return c
}
