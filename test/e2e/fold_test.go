package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/testutil"
)

// plainCRIURestore restores the CRIU images at criuDir with CRIU alone, detached, as
// someone without gpucr would, and fails t with CRIU's log if that fails.
func plainCRIURestore(t *testing.T, criuDir string) {
	t.Helper()
	d, err := criu.Find(os.Getenv("GPUCR_CRIU"))
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	out, err := hwbreak.Command(d.Path, "restore", "-D", criuDir, "--restore-detached", "-W", work, "-o", "restore.log", "-v4").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(work, "restore.log"))
		t.Fatalf("criu restore -D %s: %v\n%s\n%s", criuDir, err, out, log)
	}
}

// An image whose 64 MiB run gpucr saved in mem/ is not whole for CRIU alone (restored by
// plain criu restore, the counter's Go heap is zeros and it dies). Folded by gpucr fold, or
// checkpointed with --criu-compatible, it is: plain criu restore brings the counter back
// counting from where it stopped, its memory identical.
func TestPlainCRIURestoresFoldedAndCompatibleImages(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	w.waitCount(t, 5)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running")
	if saved, _ := filepath.Glob(filepath.Join(dir, "mem", "*.img")); len(saved) == 0 {
		t.Fatal("gpucr saved no memory itself: nothing to fold")
	}
	testutil.KillAndReap(w.pid)

	folded := filepath.Join(t.TempDir(), "folded")
	var fo foldDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "fold", "--json", dir, folded)), &fo); err != nil {
		t.Fatal(err)
	}
	if fo.Runs == 0 || fo.Bytes < 64<<20 {
		t.Errorf("fold output %+v", fo)
	}
	if _, err := os.Stat(filepath.Join(folded, "mem")); err == nil {
		t.Error("the folded image has a mem/")
	}
	mustGpucr(t, "verify", folded)
	frozen := w.read(t, "count")
	plainCRIURestore(t, filepath.Join(folded, "criu"))
	w.waitCount(t, frozen+3)
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after plain CRIU restored the folded image: %s", v)
	}

	compat := filepath.Join(t.TempDir(), "compat")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", compat, "--criu-compatible")
	testutil.WaitGone(t, w.pid)
	if saved, _ := filepath.Glob(filepath.Join(compat, "mem", "*")); len(saved) > 0 {
		t.Errorf("--criu-compatible saved memory in mem/: %v", saved)
	}
	frozen = w.read(t, "count")
	plainCRIURestore(t, filepath.Join(compat, "criu"))
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitCount(t, frozen+3)
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after plain CRIU restored a --criu-compatible image: %s", v)
	}
}

// fold reads an image's files again after verifying them: as root it refuses an image that
// others could change (its mem/ or criu/ files, or a directory of them), since a user who
// swapped a file in between had root fold unverified bytes into an image that verified.
func TestFoldRefusesAnImageOthersCouldChange(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "32")
	w.waitCount(t, 2)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running")
	for name, loosen := range map[string]func(img string) error{
		"mem/ writable by others": func(img string) error { return os.Chmod(filepath.Join(img, "mem"), 0o777) },
		"a CRIU file of another user's": func(img string) error {
			return os.Chown(filepath.Join(img, "criu", "pstree.img"), 65534, 65534)
		},
	} {
		img := copyImage(t, dir)
		if err := loosen(img); err != nil {
			t.Fatal(err)
		}
		out, code := gpucr(t, "fold", img, filepath.Join(t.TempDir(), "folded"))
		if code == 0 || !oneLineWith(out, "could be changed by others than root") {
			t.Errorf("fold of an image with %s: exit %d\n%s", name, code, out)
		}
	}
	mustGpucr(t, "fold", dir, filepath.Join(t.TempDir(), "folded"))
}

// gpucr restores an image whose large runs are in CRIU's page files (checkpointed with
// --criu-compatible, or folded) by splitting them out of a view of the image it links to:
// the check of the files CRIU reopened read that view, refused its links, and the restore
// failed with the job's only copy in the image (hostile test).
func TestGpucrRestoresACompatibleImage(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "40")
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "compat")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--criu-compatible")
	testutil.WaitGone(t, w.pid)
	frozen := w.read(t, "count")
	mustGpucr(t, "restore", "-D", dir)
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitCount(t, frozen+3)
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after gpucr restored a --criu-compatible image: %s", v)
	}
}
