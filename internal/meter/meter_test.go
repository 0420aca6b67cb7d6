package meter

import (
	"context"
	"sync"
	"testing"
)

func TestCounterCountsFromManyGoroutines(t *testing.T) {
	c := new(Counter)
	ctx := With(context.Background(), c)
	From(ctx).SetTotal(64 << 10)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() { From(ctx).Add(1 << 10) })
	}
	wg.Wait()
	if done, total := c.Load(); done != 64<<10 || total != 64<<10 {
		t.Fatalf("done %d of %d, want 65536 of 65536", done, total)
	}
	c.SetDone(5)
	if done, _ := c.Load(); done != 5 {
		t.Fatalf("done %d after SetDone(5)", done)
	}
}

func TestNoCounterCountsNothing(t *testing.T) {
	c := From(context.Background())
	if c != nil {
		t.Fatalf("a bare context carries a counter: %v", c)
	}
	c.SetTotal(1)
	c.Add(1)
	c.SetDone(1)
	if done, total := c.Load(); done != 0 || total != 0 {
		t.Fatalf("a nil counter loaded %d of %d", done, total)
	}
}
