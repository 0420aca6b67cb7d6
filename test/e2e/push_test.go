package e2e

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/store/storetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// sameFiles fails unless got holds exactly want's files with the same bytes.
func sameFiles(t *testing.T, want, got string) {
	t.Helper()
	var wantN, gotN int
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		wantN++
		rel, _ := filepath.Rel(want, p)
		a, _ := os.ReadFile(p)
		b, err := os.ReadFile(filepath.Join(got, rel))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs after push and pull (%v)", rel, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(got, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			gotN++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if wantN != gotN || wantN == 0 {
		t.Errorf("pulled %d files, want %d", gotN, wantN)
	}
}

// Two real checkpoints of the counter with 64 MiB of memory go to MinIO; the second
// uploads almost nothing; the pulled image is byte-identical to CRIU's files and restores.
func TestPushPullRealCheckpoints(t *testing.T) {
	needCRIU(t)
	srv := storetest.Start(t)
	env := srv.Env()
	base := "s3://" + srv.Bucket(t) + "/counter"
	w := startCounter(t, "-mib", "64")
	w.waitCount(t, 5)
	dirs := []string{filepath.Join(t.TempDir(), "img1"), filepath.Join(t.TempDir(), "img2")}
	for i, dir := range dirs {
		mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", dir)
		if i == 0 {
			w.waitCount(t, w.read(t, "count")+20)
		}
	}
	at := w.read(t, "count")

	var pushes [2]transferDoc
	for i, dir := range dirs {
		out := mustGpucrEnv(t, env, "push", "--json", dir, base+"/ckpt-"+strconv.Itoa(i+1))
		if err := json.Unmarshal([]byte(out), &pushes[i]); err != nil {
			t.Fatalf("push output: %v\n%s", err, out)
		}
	}
	first, second := pushes[0], pushes[1]
	// Dedup is the share of the image's non-zero bytes a push did not upload: chunks already
	// stored, or repeated within the image. The first push shows the second part alone.
	dedup := func(p transferDoc) float64 { return 1 - float64(p.TransferredBytes)/float64(p.Bytes-p.ZeroBytes) }
	for i, p := range pushes {
		t.Logf("measured: push %d: image %d bytes (%d in zero chunks), uploaded %d chunks, %d bytes as %d (zstd %.1fx), %d chunks already stored, %.2f%% of non-zero bytes not uploaded, %.2fs",
			i+1, p.Bytes, p.ZeroBytes, p.Chunks, p.TransferredBytes, p.WireBytes, float64(p.TransferredBytes)/float64(max(p.WireBytes, 1)),
			p.PresentChunks, 100*dedup(p), p.Seconds)
	}
	// How much the counter's heap moved between the two checkpoints varies from run to run;
	// without dedup across checkpoints the second push would upload as much as the first.
	// The 64 MiB heap is a range gpucr saves whole, so a changed 8 MiB window of it is
	// uploaded whole (zeros included): here one or two of them, 70-90% not uploaded (85-95%
	// with the 4 MiB chunks before 2026-11-26).
	if second.TransferredBytes >= first.TransferredBytes || second.PresentChunks == 0 || dedup(second) < 0.6 {
		t.Errorf("second checkpoint uploaded %d bytes, first %d", second.TransferredBytes, first.TransferredBytes)
	}

	var ls []lsDoc
	if err := json.Unmarshal([]byte(mustGpucrEnv(t, env, "ls", "--json", base)), &ls); err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[1].URL != base+"/ckpt-2" || ls[1].RootPID != w.pid || ls[1].Processes != 1 ||
		ls[1].MemoryBytes < 64<<20 || ls[1].Host == "" || ls[1].StoredBytes == 0 {
		t.Fatalf("ls = %+v", ls)
	}
	if out := mustGpucrEnv(t, env, "ls", base); !strings.Contains(out, base+"/ckpt-1") || !strings.Contains(out, "CREATED") {
		t.Errorf("ls text:\n%s", out)
	}

	pulled := filepath.Join(t.TempDir(), "pulled")
	mustGpucrEnv(t, env, "pull", base+"/ckpt-2", pulled)
	sameFiles(t, dirs[1], pulled)

	// A local store works the same way.
	local := filepath.Join(t.TempDir(), "store", "ckpt-1")
	mustGpucr(t, "push", dirs[0], local)
	if _, err := os.Stat(filepath.Join(filepath.Dir(local), "chunks")); err != nil {
		t.Errorf("local store has no chunks directory: %v", err)
	}
	localPulled := filepath.Join(t.TempDir(), "local-pulled")
	mustGpucr(t, "pull", local, localPulled)
	sameFiles(t, dirs[0], localPulled)

	// The pulled image restores: the counter goes on from the second checkpoint.
	testutil.KillAndReap(w.pid)
	testutil.WaitGone(t, w.pid)
	os.Remove(filepath.Join(w.dir, "count"))
	pid := restore(t, pulled)
	if c := w.waitCount(t, 1); c > at+50 {
		t.Errorf("restored counter started at %d, checkpoint was at about %d", c, at)
	}
	if v := w.verify(t, pid); v != "ok" {
		t.Fatalf("memory after restore from the pulled image: %s", v)
	}
}

// storeImage is a small real image for tests of the CLI's errors.
func storeImage(t *testing.T) string {
	t.Helper()
	w := startCounter(t)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", dir)
	return dir
}

// Errors reach the user as one line, fast, with an exit code that says whose fault it is,
// and never with a secret in them.
func TestStoreErrors(t *testing.T) {
	needCRIU(t)
	srv := storetest.Start(t)
	bucket := srv.Bucket(t)
	img := storeImage(t)
	url := "s3://" + bucket + "/x"
	mustGpucrEnv(t, srv.Env(), "push", img, url)

	wrong := append(srv.Env(), "AWS_SECRET_ACCESS_KEY=not-the-secret")
	closed := append(srv.Env(), "GPUCR_S3_ENDPOINT=http://"+storetest.FreeAddr(t))
	notStore := t.TempDir() // a project directory with a chunks/ of its own
	testutil.WriteFile(t, filepath.Join(notStore, "chunks", "results.csv"), []byte("data"))
	tests := []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"wrong credentials", wrong, []string{"ls", url}, 1, "refused our credentials (SignatureDoesNotMatch)"},
		{"unreachable endpoint", closed, []string{"push", img, url + "2"}, 1, "cannot reach http://127.0.0.1:"},
		{"missing bucket", srv.Env(), []string{"pull", "s3://no-such-bucket/x", filepath.Join(t.TempDir(), "d")}, 1, "bucket does not exist"},
		{"no checkpoint", srv.Env(), []string{"pull", url + "-missing", filepath.Join(t.TempDir(), "d")}, 1, "no complete checkpoint"},
		{"push over a checkpoint", srv.Env(), []string{"push", img, url}, 2, "a checkpoint already exists"},
		{"pull into a full directory", srv.Env(), []string{"pull", url, img}, 2, "destination is not empty"},
		{"other scheme", nil, []string{"ls", "gs://bucket"}, 2, "only s3:// URLs and local paths"},
		{"rm of no checkpoint", srv.Env(), []string{"rm", url + "-missing"}, 1, "no complete checkpoint"},
		{"gc of another scheme", nil, []string{"gc", "gs://bucket"}, 2, "only s3:// URLs and local paths"},
		{"gc of a directory that is no store", nil, []string{"gc", notStore}, 2, "\"results.csv\", which is no chunk; nothing was removed"},
		{"bad endpoint", []string{"GPUCR_S3_ENDPOINT=localhost:9000"}, []string{"ls", url}, 1, "must be an http:// or https:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			out, errOut, code := gpucrEnv(t, tt.env, tt.args...)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v to fail", took)
			}
			if code != tt.code || !strings.HasPrefix(withoutProgress(errOut), "gpucr: ") || !strings.Contains(errOut, tt.want) ||
				strings.Count(withoutProgress(errOut), "\n") != 1 || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and one line with %q", code, out, errOut, tt.code, tt.want)
			}
			for _, secret := range []string{storetest.SecretKey, "not-the-secret"} {
				if strings.Contains(errOut, secret) {
					t.Errorf("the error shows a secret: %s", errOut)
				}
			}
			// Under --json the same error is on stdout as JSON, for machines.
			out, _, code = gpucrEnv(t, tt.env, append(tt.args, "--json")...)
			var e errorDoc
			if err := json.Unmarshal([]byte(out), &e); err != nil || code != tt.code || e.ExitCode != code || !strings.Contains(e.Error, tt.want) {
				t.Errorf("with --json: exit %d, stdout %q (%v); want the error as JSON", code, out, err)
			}
		})
	}
}

// A checkpoint written locally and then stored (-D DIR --to LOC) is refused before it
// begins where it could not be stored: the workload was checkpointed (and so stopped) and the
// push then failed on a name already taken (hostile test).
func TestCheckpointDirToATakenNameIsRefusedFirst(t *testing.T) {
	needCRIU(t)
	store := filepath.Join(t.TempDir(), "store")
	mustGpucr(t, "push", storeImage(t), filepath.Join(store, "x"))
	w := startCounter(t)
	w.waitCount(t, 2)
	dir := filepath.Join(t.TempDir(), "img")
	// The store's own directory too: its chunks went to the directory above, and the
	// checkpoint hid the store's from ls (UX test).
	for to, want := range map[string]string{filepath.Join(store, "x"): "a checkpoint already exists", filepath.Join(store, "chunks", "y"): "it holds the chunks of the store",
		store: "is a store's directory"} {
		out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--to", to)
		if code != exitUsage || !oneLineWith(out, want) {
			t.Errorf("checkpoint -D --to %s: exit %d, want %d and one line with %q:\n%s", to, code, exitUsage, want, out)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the refused checkpoint wrote %s (%v)", dir, err)
	}
	w.checkRunsOn(t, "a checkpoint refused for where it was to be stored")
}

// checkpoint --to stores the image as push does, and restore --from fetches it as pull does.
func TestCheckpointToAndRestoreFrom(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "8")
	w.waitCount(t, 3)
	storeDir := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(storeDir, 0o755); err != nil {
		t.Fatal(err)
	}
	loc := filepath.Join(storeDir, "job", "ckpt-1")
	out := mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "img"), "--to", loc, "--json")
	var ck checkpointDoc
	if err := json.Unmarshal([]byte(out), &ck); err != nil || ck.Pushed == nil || ck.Pushed.URL == "" || ck.Pushed.Chunks == 0 {
		t.Fatalf("checkpoint --to: %v\n%s", err, out)
	}
	// CRIU's own account of the dump comes along (how much of the counter's memory it wrote
	// depends on whether gpucr saved the heap itself).
	if st := ck.CRIUStats; st == nil || st.PagesWritten == 0 || st.Frozen <= 0 || st.PagesScanned < st.PagesWritten {
		t.Errorf("CRIU's dump statistics: %+v", ck.CRIUStats)
	}
	testutil.WaitGone(t, w.pid)
	at := w.read(t, "count")

	dir := filepath.Join(t.TempDir(), "pulled")
	out = mustGpucr(t, "restore", "-D", dir, "--from", loc, "--json")
	var rs restoreDoc
	if err := json.Unmarshal([]byte(out), &rs); err != nil || rs.Pulled == nil || rs.RootPID != w.pid {
		t.Fatalf("restore --from: %v\n%s", err, out)
	}
	if st := rs.CRIUStats; st == nil || st.Restore <= 0 {
		t.Errorf("CRIU's restore statistics: %+v", rs.CRIUStats)
	}
	t.Cleanup(func() { testutil.KillAndReap(rs.RootPID) })
	w.waitCount(t, at+5)
	if v := w.verify(t, rs.RootPID); v != "ok" {
		t.Fatalf("memory after restore --from: %s", v)
	}
}
