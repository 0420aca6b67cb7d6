package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/engine"
)

// A full disk's message said "the processes run on" even beside a rollback that could not
// resume the GPUs, which leaves the workload stopped until gpucr recover (review).
func TestFullDiskSaysRunOnOnlyAfterAWholeRollback(t *testing.T) {
	full := fmt.Errorf("memory save: write: %w", syscall.ENOSPC)
	for _, streamed := range []bool{false, true} {
		var whole, partial engine.Undo
		whole.OnFail("resume the GPU processes", func(context.Context) error { return nil })
		partial.OnFail("resume the GPU processes", func(context.Context) error {
			return errors.New("the workload stays stopped on its GPU until `gpucr recover --pid 42` brings it back")
		})
		if msg := explainFullDisk(whole.Unwind(context.Background(), full), streamed).Error(); !strings.Contains(msg, "run on") {
			t.Errorf("after a whole rollback: %q, want it to say the processes run on", msg)
		}
		msg := explainFullDisk(partial.Unwind(context.Background(), full), streamed).Error()
		if strings.Contains(msg, "run on") || !strings.Contains(msg, "gpucr recover --pid 42") {
			t.Errorf("after a rollback that failed: %q, want no word of running on, and what failed", msg)
		}
	}
}

// fullWriter refuses every write, as a full disk does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, syscall.ENOSPC }

// A result that could not be written (stdout on a full disk) is a failure, with or without
// --json: text mode exited 0, a restore's PID line lost (hostile test).
func TestAResultThatCannotBeWrittenFails(t *testing.T) {
	store := t.TempDir()
	for _, args := range [][]string{{"ls", store}, {"ls", "--json", store}} {
		var stderr strings.Builder
		if code := run(args, fullWriter{}, &stderr); code != 1 || !strings.Contains(stderr.String(), "no space left on device") {
			t.Errorf("gpucr %s onto a full stdout: exit %d, %q", strings.Join(args, " "), code, stderr.String())
		}
	}
}
