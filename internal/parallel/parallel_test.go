package parallel

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
)

func TestEachRunsEveryJobWithPerWorkerState(t *testing.T) {
	jobs := make([]int, 1000)
	for i := range jobs {
		jobs[i] = i
	}
	var sum, states atomic.Int64
	err := Each(context.Background(), jobs, 4, func() *int { states.Add(1); return new(int) }, func(_ context.Context, j int, s *int) error {
		*s += j
		sum.Add(int64(j))
		return nil
	})
	if err != nil || sum.Load() != 999*1000/2 || states.Load() != 4 {
		t.Fatalf("err %v, sum %d, states %d", err, sum.Load(), states.Load())
	}
}

func TestEachStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	var ran atomic.Int64
	err := Each(context.Background(), make([]int, 10000), 2, func() struct{} { return struct{}{} }, func(context.Context, int, struct{}) error {
		if ran.Add(1) == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || ran.Load() > 100 {
		t.Fatalf("err %v after %d jobs", err, ran.Load())
	}
}

func TestInterleave(t *testing.T) {
	got := Interleave([][]string{{"a1", "a2", "a3"}, nil, {"c1"}, {"d1", "d2"}})
	if want := []string{"a1", "c1", "d1", "a2", "d2", "a3"}; !slices.Equal(got, want) {
		t.Fatalf("Interleave = %v, want %v", got, want)
	}
}
