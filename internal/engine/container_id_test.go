package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/txn"
)

func TestCheckContainerID(t *testing.T) {
	for _, id := range []string{"web", "job-7.rank_0", "a+b,c", strings.Repeat("a", maxContainerID)} {
		if err := CheckContainerID(id); err != nil {
			t.Errorf("%q refused: %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "a/b", "../x", "/abs", "a b", "a\nb", "-h", "-d", "--root=x", strings.Repeat("a", maxContainerID+1)} {
		if CheckContainerID(id) == nil {
			t.Errorf("%q taken as a container ID", id)
		}
	}
}

// A rollback (or a recover, from a journal) removes a container's state directory only
// when it is the runtime's own for a valid ID: a record naming "..", or a state directory
// elsewhere, leaves everything as it is and runs no runtime.
func TestRemoveContainerTouchesOnlyTheContainersStateDir(t *testing.T) {
	root := t.TempDir()
	victim := filepath.Join(root, "victim")
	if err := os.Mkdir(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(root, "ran")
	runtime := []string{"/bin/sh", "-c", "touch " + ran, "sh"}
	for _, c := range []*txn.Container{
		{ID: "..", Runtime: runtime, StateDir: root},
		{ID: "victim/..", Runtime: runtime, StateDir: victim},
		{ID: "c1", Runtime: runtime, StateDir: victim},
	} {
		if err := RemoveContainer(context.Background(), c); err == nil {
			t.Errorf("RemoveContainer(%+v) = nil, want a refusal", c)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("the directory a record named was removed: %v", err)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the runtime was run for a refused record")
	}
}
