package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/store/storetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// checkpoint --to without -D streams: a two-process tree with 64 MiB of memory is
// checkpointed into MinIO with a TMPDIR of 4 MiB, so its pages cannot have been written
// locally; it lists, pulls as a verified image and restores with its memory intact; a
// second streamed checkpoint and a pushed one reuse its chunks.
func TestStreamedCheckpointToS3(t *testing.T) {
	needCRIU(t)
	srv := storetest.Start(t)
	env := append(srv.Env(), "TMPDIR="+smallTmp(t, 4<<20))
	base := "s3://" + srv.Bucket(t) + "/stream"
	w := startCounter(t, "-mib", "64", "-child")
	w.waitCount(t, 5)

	var first checkpointDoc
	out := mustGpucrEnv(t, env, "checkpoint", "--leave-running", "--json", strconv.Itoa(w.pid), "--to", base+"/ckpt-1")
	if err := json.Unmarshal([]byte(out), &first); err != nil || !first.Streamed || first.Pushed == nil {
		t.Fatalf("streamed checkpoint: %v\n%s", err, out)
	}
	if first.MemoryBytes < 64<<20 || first.Pushed.Bytes < int64(first.MemoryBytes) || first.Processes != 2 {
		t.Fatalf("streamed checkpoint holds %d bytes of memory, %d in all, %d processes", first.MemoryBytes, first.Pushed.Bytes, first.Processes)
	}
	if entries, _ := os.ReadDir(strings.TrimPrefix(env[len(env)-1], "TMPDIR=")); len(entries) != 0 {
		t.Errorf("the stream left %d entries in TMPDIR", len(entries))
	}
	w.waitCount(t, w.read(t, "count")+10)

	out = mustGpucrEnv(t, env, "checkpoint", "--leave-running", "--json", strconv.Itoa(w.pid), "--to", base+"/ckpt-2")
	var second checkpointDoc
	if err := json.Unmarshal([]byte(out), &second); err != nil || second.Pushed == nil {
		t.Fatalf("second streamed checkpoint: %v\n%s", err, out)
	}
	if p := second.Pushed; p.PresentChunks == 0 || p.TransferredBytes >= first.Pushed.TransferredBytes {
		t.Errorf("second stream uploaded %d bytes (%d chunks already stored), first %d", p.TransferredBytes, p.PresentChunks, first.Pushed.TransferredBytes)
	}
	// A local image pushed after it cuts its page files the same way: it finds them stored.
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", img)
	var pushed transferDoc
	if err := json.Unmarshal([]byte(mustGpucrEnv(t, env, "push", "--json", img, base+"/ckpt-3")), &pushed); err != nil {
		t.Fatal(err)
	}
	if pushed.PresentChunks == 0 {
		t.Errorf("a push after two streamed checkpoints found none of its chunks stored: %+v", pushed)
	}

	var ls []lsDoc
	if err := json.Unmarshal([]byte(mustGpucrEnv(t, env, "ls", "--json", base)), &ls); err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 || ls[1].URL != base+"/ckpt-2" || ls[1].Processes != 2 || ls[1].MemoryBytes != second.MemoryBytes {
		t.Fatalf("ls = %+v", ls)
	}

	at := w.read(t, "count")
	pulled := filepath.Join(t.TempDir(), "pulled")
	mustGpucrEnv(t, env, "pull", base+"/ckpt-2", pulled)
	mustGpucr(t, "verify", pulled)
	if saved, _ := filepath.Glob(filepath.Join(pulled, "mem", "*.img")); len(saved) == 0 {
		t.Error("the streamed checkpoint holds no memory gpucr saved itself")
	}
	var ins inspectDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", pulled)), &ins); err != nil {
		t.Fatal(err)
	}
	testutil.KillAndReap(w.pid)
	for _, p := range ins.Manifest.Processes {
		testutil.WaitReaped(t, p.PID)
	}
	os.Remove(filepath.Join(w.dir, "count"))
	pid := restore(t, pulled)
	if c := w.waitCount(t, 1); c > at {
		t.Errorf("restored counter started at %d, after the second checkpoint it was at %d", c, at)
	}
	if v := w.verify(t, pid); v != "ok" {
		t.Fatalf("memory after restoring a streamed checkpoint: %s", v)
	}
}

// A store that fails while CRIU is sending pages fails the checkpoint: the tree keeps
// running and nothing lists as a checkpoint.
func TestStreamFailingMidwayKeepsWorkloadRunning(t *testing.T) {
	needCRIU(t)
	storeDir := t.TempDir()
	// A file where the chunks directory goes: every chunk upload fails.
	if err := os.WriteFile(filepath.Join(storeDir, "chunks"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w := startCounter(t, "-mib", "16")
	w.waitCount(t, 3)
	loc := filepath.Join(storeDir, "ckpt-1")
	out, errOut, code := gpucrEnv(t, nil, "checkpoint", strconv.Itoa(w.pid), "--to", loc)
	if code != 1 || out != "" || strings.Count(withoutProgress(errOut), "\n") != 1 || !strings.Contains(errOut, "chunks") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and one line naming the chunks", code, out, errOut)
	}
	w.checkRunsOn(t, "the failed stream")
	if _, err := os.Stat(loc); err == nil {
		t.Errorf("a failed stream left %s", loc)
	}
	if out, _, code := gpucrEnv(t, nil, "ls", storeDir); code != 0 || strings.Contains(out, "ckpt-1") {
		t.Errorf("ls after a failed stream (exit %d):\n%s", code, out)
	}
}

// killedStream kills gpucr at point in a streamed checkpoint of a counter to the store
// "killed" in a new store directory, and checks that the recovery left the counter running
// and nothing behind. It returns the store directory, the host and the counter.
func killedStream(t *testing.T, point string) (string, crashHost, *workload) {
	t.Helper()
	needCRIU(t)
	storeDir := t.TempDir()
	host := newCrashHost(t)
	w := startCounter(t, "-mib", "16")
	w.waitCount(t, 3)
	killedAt(t, point, nil, append([]string{"checkpoint", strconv.Itoa(w.pid), "--to", filepath.Join(storeDir, "killed")}, host.flags()...)...)
	host.checkClean(t)
	w.checkRunsOn(t, "the stream killed at "+point)
	return storeDir, host, w
}

// A streamed checkpoint killed after its memory went to the store leaves chunks that no
// checkpoint references; gc removes exactly those (its lease does not hold gc up: its gpucr
// is gone) and rm removes a checkpoint with the chunks only it used.
func TestKilledStreamLeavesChunksThatGcRemoves(t *testing.T) {
	storeDir, _, w := killedStream(t, "end criu-dump")
	chunks := func() int {
		es, _ := os.ReadDir(filepath.Join(storeDir, "chunks"))
		return len(es)
	}
	if chunks() == 0 {
		t.Fatal("the killed stream stored no chunk")
	}
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "--to", filepath.Join(storeDir, "kept"), "--leave-running")
	var dry, gc collectDoc
	decode(t, mustGpucr(t, "gc", storeDir, "--dry-run", "--json"), &dry)
	before := chunks()
	decode(t, mustGpucr(t, "gc", storeDir, "--json"), &gc)
	if dry.RemovedChunks == 0 || gc.RemovedChunks != dry.RemovedChunks || gc.Checkpoints != 1 || chunks() != before-gc.RemovedChunks || chunks() != gc.KeptChunks {
		t.Fatalf("gc: dry run %+v, then %+v; %d chunks before, %d after", dry, gc, before, chunks())
	}
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "pull", filepath.Join(storeDir, "kept"), img)
	mustGpucr(t, "verify", img)

	if _, errOut, code := gpucrEnv(t, nil, "gc", filepath.Join(storeDir, "kept")); code != 2 || !oneLineWith(errOut, "is a checkpoint") {
		t.Errorf("gc of a checkpoint: exit %d, %q", code, errOut)
	}
	var rm collectDoc
	decode(t, mustGpucr(t, "rm", filepath.Join(storeDir, "kept"), "--json"), &rm)
	if rm.Deleted == "" || rm.Checkpoints != 0 || chunks() != 0 {
		t.Errorf("rm: %+v, %d chunks left", rm, chunks())
	}
	if _, errOut, code := gpucrEnv(t, nil, "rm", filepath.Join(storeDir, "kept")); code == 0 || !oneLineWith(errOut, "no complete checkpoint") {
		t.Errorf("rm of a deleted checkpoint: exit %d, %q", code, errOut)
	}
}

// A streamed checkpoint killed once its manifest is stored, before its journal says so, is
// complete in the store while its workload is rolled back: the recovery says where to look
// instead of leaving the user to think nothing was stored.
func TestKilledStreamAfterItsManifestSaysWhereItIs(t *testing.T) {
	storeDir, host, _ := killedStream(t, "end commit")
	loc := filepath.Join(storeDir, "killed")
	if out := mustGpucr(t, "ls", storeDir); !strings.Contains(out, "killed") {
		t.Fatalf("ls does not list the checkpoint whose manifest was stored:\n%s", out)
	}
	b, _ := os.ReadFile(filepath.Join(host.run, "recovery.log"))
	if !strings.Contains(string(b), "the checkpoint is complete if `gpucr ls` lists it") || !strings.Contains(string(b), loc) {
		t.Errorf("the recovery log does not say where the stored checkpoint is:\n%s", b)
	}
}

// Without -D or --to there is nowhere to put the image: a usage error.
func TestCheckpointNeedsADestination(t *testing.T) {
	for _, args := range [][]string{{"checkpoint", "1234"}, {"checkpoint", "--container", "c1"}} {
		_, errOut, code := gpucrEnv(t, nil, args...)
		if code != 2 || !strings.Contains(errOut, "-D DIR") {
			t.Errorf("gpucr %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
	}
}
