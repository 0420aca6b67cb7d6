package e2e

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/store/storetest"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// restoreStreamed restores the checkpoint at loc with restore --from and no -D, with env,
// and returns what it reported.
func restoreStreamed(t *testing.T, env []string, loc string, args ...string) restoreDoc {
	t.Helper()
	out := restoreJSON(t, env, append([]string{"--from", loc}, args...)...)
	if out.Streamed == nil || out.Pulled != nil {
		t.Fatalf("restore --from without -D did not stream: %+v", out)
	}
	return out
}

// noStaging fails t if a restore left its fetched files or its work directory in tmp (a
// failed one keeps CRIU's log there, gpucr-criu-*.log, on purpose).
func noStaging(t *testing.T, tmp string) {
	t.Helper()
	for _, pattern := range []string{"gpucr-stream-*", "gpucr-restore-*"} {
		if left, _ := filepath.Glob(filepath.Join(tmp, pattern)); len(left) != 0 {
			t.Errorf("the restore left %v", left)
		}
	}
}

// restore --from streams from S3 and from a local store alike: a checkpoint streamed there
// (checkpoint --to) and one pushed there (push, in the order restore needs) restore the
// counter with its memory intact, the memory gpucr saved written straight from the store's
// chunks and none of it fetched to local disk.
func TestStreamedRestoreFromS3AndLocalStore(t *testing.T) {
	needCRIU(t)
	srv := storetest.Start(t)
	for _, c := range []struct{ name, base string }{
		{"s3", "s3://" + srv.Bucket(t) + "/jobs"},
		{"local", filepath.Join(t.TempDir(), "jobs")},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmp := t.TempDir()
			env := append(srv.Env(), "TMPDIR="+tmp)
			w := startCounter(t, "-mib", "64")
			w.waitCount(t, 3)
			mustGpucrEnv(t, env, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "--to", c.base+"/streamed")
			img := filepath.Join(t.TempDir(), "img")
			mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img)
			mustGpucrEnv(t, env, "push", img, c.base+"/pushed")
			testutil.WaitGone(t, w.pid)
			at := w.read(t, "count")

			for _, name := range []string{"streamed", "pushed"} {
				out := restoreStreamed(t, env, c.base+"/"+name)
				s := out.Streamed
				if out.RootPID != w.pid || out.Dir != c.base+"/"+name || s.MemoryBytes < 64<<20 || s.Chunks == 0 || s.FetchedBytes >= s.MemoryBytes/10 {
					t.Fatalf("%s: restore --from reported %+v, streamed %+v", name, out, s)
				}
				w.waitCount(t, at+3)
				if v := w.verify(t, out.RootPID); v != "ok" {
					t.Fatalf("%s: memory after a streamed restore: %s", name, v)
				}
				noStaging(t, tmp)
				testutil.KillAndReap(out.RootPID)
				testutil.WaitReaped(t, out.RootPID)
				os.Remove(filepath.Join(w.dir, "count"))
			}
		})
	}
}

// A streamed restore of an image several times larger than TMPDIR succeeds, and the most
// it ever has on local disk (measured on the tmpfs throughout) is within its bound, which
// the docs state.
func TestStreamedRestoreStaysWithinItsLocalBound(t *testing.T) {
	needCRIU(t)
	tmp := smallTmp(t, 64<<20)
	env := []string{"TMPDIR=" + tmp}
	w := startCounter(t, "-mib", "320")
	w.waitCount(t, 3)
	loc := filepath.Join(t.TempDir(), "store", "big")
	mustGpucrEnv(t, env, "checkpoint", strconv.Itoa(w.pid), "--to", loc)
	testutil.WaitGone(t, w.pid)

	out, peak := restoreStreamedPeak(t, env, loc, tmp)
	s := out.Streamed
	if s.MemoryBytes < 5*64<<20 || s.LocalBound != chunked.LocalBound(s.MemoryBytes+s.FetchedBytes) {
		t.Fatalf("streamed %+v", s)
	}
	if peak == 0 || peak > s.LocalBound {
		t.Fatalf("the restore used %d bytes of TMPDIR at most, its bound is %d", peak, s.LocalBound)
	}
	t.Logf("peak local use %d KiB for a %d MiB image (bound %d MiB)", peak>>10, (s.MemoryBytes+s.FetchedBytes)>>20, s.LocalBound>>20)
	if v := w.verify(t, out.RootPID); v != "ok" {
		t.Fatalf("memory after a streamed restore: %s", v)
	}
	noStaging(t, tmp)
}

// restoreStreamedPeak is restoreStreamed, measuring the most of tmp (a file system of its
// own) in use while it runs.
func restoreStreamedPeak(t *testing.T, env []string, loc, tmp string) (restoreDoc, int64) {
	t.Helper()
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var fs syscall.Statfs_t
			if syscall.Statfs(tmp, &fs) == nil {
				if used := int64(fs.Blocks-fs.Bfree) * fs.Bsize; used > peak.Load() {
					peak.Store(used)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	out := restoreStreamed(t, env, loc)
	close(stop)
	wg.Wait()
	return out, peak.Load()
}

// CRIU's own page files are fetched; the restore's copy of them without the long runs gpucr
// fills is a gain of speed only, made where it fits in the bound. An image whose CRIU files
// fit but whose copy would not (a model server's Python heap, measured on the H100: 186 MiB of
// CRIU pages in a 7.1 GiB image, refused when the copy was counted) restores with CRIU
// restoring those pages itself, within the bound.
func TestStreamedRestoreWithoutRoomForTheCopy(t *testing.T) {
	needCRIU(t)
	tmp := smallTmp(t, 64<<20)
	env := []string{"TMPDIR=" + tmp}
	w := startCounter(t, "-mib", "24")
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--criu-writes-pages")
	testutil.WaitGone(t, w.pid)
	loc := filepath.Join(t.TempDir(), "store", "criu-pages")
	mustGpucr(t, "push", dir, loc)

	out, peak := restoreStreamedPeak(t, env, loc, tmp)
	s := out.Streamed
	if s.FetchedBytes < 24<<20 || 2*s.FetchedBytes <= s.LocalBound {
		t.Fatalf("the image does not test this: %d bytes fetched, bound %d", s.FetchedBytes, s.LocalBound)
	}
	if peak == 0 || peak > s.LocalBound {
		t.Fatalf("the restore used %d bytes of TMPDIR at most, its bound is %d", peak, s.LocalBound)
	}
	if v := w.verify(t, out.RootPID); v != "ok" {
		t.Fatalf("memory after a streamed restore: %s", v)
	}
	noStaging(t, tmp)
}

// A chunk of the saved memory that changed in the store fails the restore with one line
// naming it, and leaves no process and nothing in TMPDIR.
func TestStreamedRestoreRefusesACorruptedChunk(t *testing.T) {
	needCRIU(t)
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp}
	w := startCounter(t, "-mib", "32")
	w.waitCount(t, 3)
	loc := filepath.Join(t.TempDir(), "ckpt")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "--to", loc)
	testutil.WaitGone(t, w.pid)

	b, err := os.ReadFile(filepath.Join(loc, chunked.ManifestObject))
	if err != nil {
		t.Fatal(err)
	}
	var m chunked.Manifest
	decode(t, string(b), &m)
	damaged := ""
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			if path.Dir(f.Path) == "mem" && !c.Zero && damaged == "" {
				damaged = "/" + chunked.ChunkKey(strings.TrimPrefix(loc, "/"), c.SHA256)
			}
		}
	}
	if damaged == "" {
		t.Fatal("the checkpoint holds no chunk of saved memory")
	}
	if err := os.WriteFile(damaged, []byte("some other bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := gpucrEnv(t, env, "restore", "--from", loc)
	if code != 1 || out != "" || !oneLineWith(errOut, filepath.Base(damaged)) || !strings.Contains(errOut, "corrupted") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and one line naming the chunk", code, out, errOut)
	}
	if testutil.Alive(w.pid) {
		t.Errorf("PID %d runs after the failed restore", w.pid)
	}
	noStaging(t, tmp)
	// CRIU's log is kept for an error that names it; this one names the chunk (hostile test).
	if logs, _ := filepath.Glob(filepath.Join(tmp, "gpucr-criu-*.log")); len(logs) != 0 {
		t.Errorf("the restore kept %v, which its error does not name", logs)
	}
}

// A streamed restore killed anywhere leaves nothing: no journal, lock or fetched file, and
// either no process or the whole restored counter; the store restores again.
func TestKilledStreamedRestoreLeavesNothing(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "32")
	w.waitCount(t, 3)
	loc := filepath.Join(t.TempDir(), "ckpt")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "--to", loc)
	testutil.WaitGone(t, w.pid)
	for _, point := range []string{"begin", "in criu-restore", "start memory-fill", "end memory-fill", "end criu-restore"} {
		t.Run(point, func(t *testing.T) {
			host := newCrashHost(t)
			tmp := t.TempDir()
			env := []string{"TMPDIR=" + tmp}
			killedAt(t, point, env, append([]string{"restore", "--from", loc}, host.flags()...)...)
			host.checkClean(t)
			noStaging(t, tmp)
			t.Cleanup(func() { testutil.KillAndReap(w.pid) })
			if !testutil.Alive(w.pid) {
				testutil.WaitReaped(t, w.pid)
				restoreStreamed(t, env, loc, host.flags()...)
			}
			untraced(t, w.pid)
			if v := w.verify(t, w.pid); v != "ok" {
				t.Fatalf("memory after a restore killed at %s: %s", point, v)
			}
			testutil.KillAndReap(w.pid)
			testutil.WaitReaped(t, w.pid)
		})
	}
}

// A gpucr killed while it stages a streamed operation's files, before the operation itself
// is journaled (restore --from fetching CRIU's files, checkpoint --to at its begin), leaves
// them to recovery: the next gpucr run, or gpucr recover, removes them.
func TestKilledStagingIsRecovered(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "16")
	w.waitCount(t, 3)
	loc := filepath.Join(t.TempDir(), "store", "ckpt")
	mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "--to", loc)
	for _, c := range []struct {
		name, point string
		args        []string
		next        []string // the gpucr run after the kill
	}{
		{"restore in fetch", "in fetch", []string{"restore", "--from", loc}, []string{"recover"}},
		{"checkpoint at begin", "begin", []string{"checkpoint", "--leave-running", strconv.Itoa(w.pid), "--to", loc + "-2"},
			[]string{"checkpoint", "--leave-running", strconv.Itoa(w.pid), "--to", loc + "-3"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			host := newCrashHost(t)
			tmp := t.TempDir()
			env := []string{"TMPDIR=" + tmp}
			killedAt(t, c.point, env, append(c.args, host.flags()...)...)
			if left, _ := filepath.Glob(filepath.Join(tmp, "gpucr-stream-*")); len(left) == 0 {
				t.Fatal("the killed gpucr left no staged files: the kill came too late to test their recovery")
			}
			// The checkpoint's guardian rolls its own operation back; the next run waits for it.
			waitUnheld(t, host.run)
			mustGpucrEnv(t, env, append(c.next, host.flags()...)...)
			host.checkClean(t)
			noStaging(t, tmp)
		})
	}
}

// waitUnheld waits until no live gpucr or guardian holds an operation under run.
func waitUnheld(t *testing.T, run string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ops, err := txn.List(run)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ops, func(e txn.Entry) bool { return e.Held }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s operations are still held: %+v", ops)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
