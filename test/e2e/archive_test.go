package e2e

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/testutil"
)

// needCheckpointctl finds the checkpointctl that scripts/install-checkpointctl.sh builds
// ($GPUCR_CHECKPOINTCTL first), skipping (or under CI failing) without it.
func needCheckpointctl(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("GPUCR_CHECKPOINTCTL"), "/var/cache/gpucr-build/checkpointctl/bin/checkpointctl"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	const why = "no checkpointctl: run scripts/install-checkpointctl.sh (make deps)"
	testutil.SkipOrFail(t, why)
	return ""
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// A container checkpointed with --export and no -D becomes one zstd archive and nothing
// else; checkpointctl shows and inspects it; gpucr inspect reads it in place; restore
// --import brings the container back counting, with the 32 MiB gpucr saved itself intact.
func TestContainerExportReadByCheckpointctlAndImported(t *testing.T) {
	cctl := needCheckpointctl(t)
	_, bundle, id, id2 := counterContainer(t, "x", "-mib", "32")
	out := t.TempDir()
	file := filepath.Join(out, "ckpt.tar.zst")
	var ck checkpointDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "checkpoint", "--json", "--container", id, "--export", file)), &ck); err != nil {
		t.Fatal(err)
	}
	if ck.Exported == nil || ck.Exported.File != file || ck.Exported.Compression != "zstd" || ck.Dir != "" {
		t.Errorf("checkpoint output: dir %q, exported %+v", ck.Dir, ck.Exported)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 1 {
		t.Errorf("--export without -D left %v beside the archive", entries)
	}
	frozen := count(t, bundle)

	show := mustRun(t, cctl, "show", file)
	if !strings.Contains(show, id[:12]) || !strings.Contains(show, "runc") {
		t.Errorf("checkpointctl show:\n%s", show)
	}
	ins := mustRun(t, cctl, "inspect", "--ps-tree", "--stats", file)
	if !strings.Contains(ins, "counter") || !strings.Contains(ins, "CRIU dump statistics") {
		t.Errorf("checkpointctl inspect:\n%s", ins)
	}

	var gi inspectDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", file)), &gi); err != nil {
		t.Fatal(err)
	}
	if gi.Archive == nil || gi.Archive.Layout != "gpucr" || gi.Manifest == nil || gi.Container == nil || gi.Container.ID != id ||
		len(gi.CRIU.Processes) != 1 || gi.CRIU.Processes[0].MemoryBytes < 32<<20 || gi.CRIUStats == nil {
		t.Errorf("gpucr inspect of the archive: %+v", gi)
	}

	var rs restoreDoc
	dir := filepath.Join(t.TempDir(), "img")
	if err := json.Unmarshal([]byte(mustGpucr(t, "restore", "--json", "--container", id, "--import", file, "-D", dir, "--new-id", id2)), &rs); err != nil {
		t.Fatal(err)
	}
	checkCountsOn(t, bundle, frozen)
	w := &workload{dir: filepath.Join(bundle, "rootfs")}
	if v := w.verify(t, rs.RootPID); v != "ok" {
		t.Fatalf("memory of the imported container: %s", v)
	}

	// Without gpucr's part it is podman's layout: checkpointctl and gpucr inspect read it,
	// and restore refuses it in one line, pointing at podman.
	podman := withoutGpucrPart(t, file)
	if show := mustRun(t, cctl, "show", podman); !strings.Contains(show, id[:12]) {
		t.Errorf("checkpointctl show of the podman layout:\n%s", show)
	}
	gi = inspectDoc{}
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", podman)), &gi); err != nil {
		t.Fatal(err)
	}
	if gi.Archive == nil || gi.Archive.Layout != "podman" || gi.Archive.Compression != "none" || gi.Manifest != nil || len(gi.CRIU.Processes) != 1 {
		t.Errorf("gpucr inspect of the podman layout: %+v", gi)
	}
	o, code := gpucr(t, "restore", "--container", id, "--import", podman, "-D", filepath.Join(t.TempDir(), "img"))
	if code != exitUsage || !oneLineWith(o, "podman container restore --import") {
		t.Errorf("restore --import of a podman archive: exit %d: %s", code, o)
	}
}

// withoutGpucrPart rewrites the zstd archive file as a plain tar without its gpucr/ part.
func withoutGpucrPart(t *testing.T, file string) string {
	t.Helper()
	in, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	z, err := zstd.NewReader(in)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	path := filepath.Join(t.TempDir(), "podman.tar")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tr, tw := tar.NewReader(z), tar.NewWriter(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(h.Name, "gpucr/") {
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// --export is refused before anything is checkpointed when it cannot be written, or
// without a container.
func TestExportRefusedUpFront(t *testing.T) {
	existing := filepath.Join(t.TempDir(), "x.tar")
	if err := os.WriteFile(existing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"checkpoint", "1", "--export", filepath.Join(t.TempDir(), "x.tar")},
		{"checkpoint", "--container", "c", "--export", existing},
		{"checkpoint", "--container", "c", "--export", filepath.Join(t.TempDir(), "missing", "x.tar")},
		{"checkpoint", "--container", "c", "--export", filepath.Join(t.TempDir(), "x.tar"), "--to", t.TempDir()},
	} {
		if out, code := gpucr(t, args...); code != exitUsage || strings.Contains(strings.TrimSpace(out), "\n") {
			t.Errorf("gpucr %s: exit %d: %s", strings.Join(args, " "), code, out)
		}
	}
	// The archive in place of the image, or inside it: the container was checkpointed and
	// removed before the export failed (tester's report).
	dir := filepath.Join(t.TempDir(), "img")
	for _, file := range []string{dir, filepath.Join(dir, "x.tar")} {
		if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
			t.Fatal(err)
		}
		if out, code := gpucr(t, "checkpoint", "--container", "c", "-D", dir, "--export", file); code != exitUsage || !strings.Contains(out, "is the image directory -D") {
			t.Errorf("checkpoint -D %s --export %s: exit %d: %s", dir, file, code, out)
		}
	}
}
