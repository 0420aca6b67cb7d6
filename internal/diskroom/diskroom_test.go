package diskroom

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// What is to be written must leave 5% of the file system free (at most 1 GiB).
func TestCheck(t *testing.T) {
	dir := testutil.SmallTmpfs(t, "32m")
	if err := Check(dir, 16<<20); err != nil {
		t.Fatalf("16 MiB into an empty 32 MiB file system: %v", err)
	}
	var full *FullError
	if err := Check(dir, 31<<20); !errors.As(err, &full) || !strings.Contains(err.Error(), "keeps 1.6 MiB for others") {
		t.Fatalf("31 MiB into 32: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), bytes.Repeat([]byte{1}, 31<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(dir, 0); !errors.As(err, &full) || !strings.Contains(err.Error(), "kept for others") {
		t.Fatalf("a file system 31/32 full: %v", err)
	}
	if Keep(1<<40) != 1<<30 || Keep(100<<20) != 5<<20 {
		t.Errorf("Keep: %d and %d, want 1 GiB and 5 MiB", Keep(1<<40), Keep(100<<20))
	}
}
