package container

import (
	"os"
	"path/filepath"
	"testing"
)

// The reason a fill failed is read back from its log for the restore's error.
func TestFillFailureReadsTheLoggedError(t *testing.T) {
	work := t.TempDir()
	if got := fillFailure(work); got != "" {
		t.Errorf("no log: %q", got)
	}
	log := `time=x level=INFO msg="memory already filled"
time=y level=ERROR msg="memory fill" err="memory fill: process 7 of the image is not among the restored processes"
`
	if err := os.WriteFile(filepath.Join(work, fillLog), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := fillFailure(work), "memory fill: process 7 of the image is not among the restored processes"; got != want {
		t.Errorf("fillFailure = %q, want %q", got, want)
	}
}
