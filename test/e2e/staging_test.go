package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killWhenAppears runs gpucr with args and kills it (SIGKILL) as soon as glob matches.
func killWhenAppears(t *testing.T, glob string, args ...string) {
	t.Helper()
	killWhenAppearsIn(t, "", glob, args...)
}

// killWhenAppearsIn is killWhenAppears with gpucr working in dir.
func killWhenAppearsIn(t *testing.T, dir, glob string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin.gpucr, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Microsecond) {
		if m, _ := filepath.Glob(glob); len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("%s never appeared", glob)
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// A gpucr killed while `checkpoint --container ID --export FILE` (no -D) packs the archive
// had committed the checkpoint, and runc had removed the container: the image it packs from
// is then the job's only copy. Recovery keeps it, names it and removes the partial archive;
// the container is restored from it. A hostile pass found the image in a hidden directory
// that nothing named, recover saying "nothing to recover".
func TestKilledExportKeepsTheCheckpoint(t *testing.T) {
	runc, bundle, id, id2 := counterContainer(t, "k", "-random-mib", "48")
	host := newCrashHost(t)
	out := t.TempDir()
	file := filepath.Join(out, "ckpt.tar.gz") // gzip is slow: a window to kill in
	killWhenAppears(t, filepath.Join(out, ".ckpt.tar.gz.partial-*"), append([]string{"checkpoint", "--container", id, "--export", file}, host.flags()...)...)
	if !gone(runc, id) {
		t.Fatal("the container still exists: the archive was written before the checkpoint committed")
	}
	frozen := count(t, bundle)
	said := mustGpucr(t, append([]string{"recover"}, host.flags()...)...)
	host.checkClean(t)
	kept, _ := filepath.Glob(file + ".image-*")
	if len(kept) != 1 || !strings.Contains(said, "kept the complete checkpoint at "+kept[0]) {
		t.Fatalf("recover said %q; kept %v", said, kept)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 1 {
		t.Errorf("beside the archive after recover: %v, want only the kept image", entries)
	}
	mustGpucr(t, "restore", "--container", id, "-D", kept[0], "--new-id", id2)
	checkCountsOn(t, bundle, frozen)
}

// pull and fold (and restore --import, journaled alike) stage up to a whole image beside
// their destination: a gpucr killed halfway left it there for good (a hostile pass found
// three pulls' copies, never removed by recover or a later pull). Each staging is journaled
// before it exists, and recovery removes it.
func TestKilledStagingBesideTheDestinationIsRemoved(t *testing.T) {
	needCRIU(t)
	host, img := imageToStageFrom(t)
	store := filepath.Join(t.TempDir(), "store")
	mustGpucr(t, "push", img, filepath.Join(store, "c1"))

	out := t.TempDir()
	killWhenAppears(t, filepath.Join(out, ".p.partial-*", "img", "mem"), append([]string{"pull", filepath.Join(store, "c1"), filepath.Join(out, "p")}, host.flags()...)...)
	killWhenAppears(t, filepath.Join(out, ".f.partial-*"), append([]string{"fold", img, filepath.Join(out, "f")}, host.flags()...)...)
	mustGpucr(t, append([]string{"recover"}, host.flags()...)...)
	host.checkClean(t)
	if left, _ := filepath.Glob(filepath.Join(out, ".*.partial-*")); len(left) > 0 {
		t.Fatalf("a killed pull or fold left %v after recover", left)
	}
}

// A destination given relative to gpucr's working directory was journaled so, and read by a
// recovery working elsewhere it named nothing: a killed fold's staging stayed for good
// (review), a killed export's kept checkpoint went unnamed. Records hold absolute paths.
func TestKilledStagingOfARelativeDestinationIsRemoved(t *testing.T) {
	needCRIU(t)
	host, img := imageToStageFrom(t)
	out := t.TempDir()
	killWhenAppearsIn(t, out, filepath.Join(out, ".f.partial-*"), append([]string{"fold", img, "f"}, host.flags()...)...)
	mustGpucr(t, append([]string{"recover"}, host.flags()...)...) // run elsewhere: the test's own directory
	host.checkClean(t)
	if left, _ := filepath.Glob(filepath.Join(out, ".*.partial-*")); len(left) > 0 {
		t.Fatalf("a killed fold into a relative path left %v after recover", left)
	}
}

// imageToStageFrom is a crash host and the image of a counter of 48 MiB, left running, on
// it: large enough that its staging is there to be killed in.
func imageToStageFrom(t *testing.T) (crashHost, string) {
	t.Helper()
	host := newCrashHost(t)
	w := startCounter(t, "-random-mib", "48")
	w.waitCount(t, 3)
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", img, "--leave-running"}, host.flags()...)...)
	return host, img
}
