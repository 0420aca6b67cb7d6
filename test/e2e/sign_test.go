package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// A signed image restores, pulls and verifies only under a key the user trusts; an image
// changed after signing, signed by another key or not signed at all is refused with one
// line, before anything runs; without --trust unsigned images keep working.
func TestSignedImages(t *testing.T) {
	needCRIU(t)
	keys := t.TempDir()
	alice, mallory := filepath.Join(keys, "alice"), filepath.Join(keys, "mallory")
	var kg keygenDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "keygen", alice, "--json")), &kg); err != nil || len(kg.KeyID) != 16 {
		t.Fatalf("keygen: %v %+v", err, kg)
	}
	mustGpucr(t, "keygen", mallory)
	if out, code := gpucr(t, "keygen", alice); code == 0 {
		t.Fatalf("keygen over an existing key: exit 0\n%s", out)
	}

	// A key others can read signs nothing, and the workload is not touched.
	w := startCounter(t, "-mib", "4")
	w.waitCount(t, 2)
	loose := filepath.Join(keys, "loose")
	mustGpucr(t, "keygen", loose)
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "x"), "--sign", loose); code != exitUsage || !strings.Contains(out, "chmod 600") {
		t.Fatalf("--sign with a key others can read: exit %d\n%s", code, out)
	}
	w.checkRunsOn(t, "a refused --sign")

	store := t.TempDir()
	loc := filepath.Join(store, "job", "signed")
	dir := filepath.Join(t.TempDir(), "img")
	var ck checkpointDoc
	out := mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--to", loc, "--sign", alice, "--json")
	if err := json.Unmarshal([]byte(out), &ck); err != nil || ck.SignedBy != kg.KeyID {
		t.Fatalf("checkpoint --sign: %v\n%s", err, out)
	}
	testutil.WaitGone(t, w.pid)
	at := w.read(t, "count")

	var v verifyDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "verify", dir, "--trust", alice+".pub", "--json")), &v); err != nil || v.SignedBy != kg.KeyID {
		t.Fatalf("verify --trust: %v %+v", err, v)
	}
	refused := func(what, want string, args ...string) {
		t.Helper()
		out, code := gpucr(t, args...)
		if code != exitFailed || !oneLineWith(out, want) {
			t.Fatalf("%s: exit %d, want one line naming %q:\n%s", what, code, want, out)
		}
		if testutil.Alive(w.pid) {
			t.Fatalf("%s: a process of the refused image runs", what)
		}
	}
	refused("verify under another key", "not among the 1 trusted", "verify", dir, "--trust", mallory+".pub")
	refused("restore under another key", "not among the 1 trusted", "restore", "-D", dir, "--trust", mallory+".pub")

	// Someone who can write the image changes it and seals it again: the old signature
	// no longer matches, and no signature is not trusted either.
	changed := imagetest.Recommit(t, dir, func(string) {})
	refused("unsigned image", "not signed", "restore", "-D", changed, "--trust", alice+".pub")
	changed = imagetest.Recommit(t, dir, func(staged string) {
		p := largestPagesFile(t, staged)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		testutil.WriteFile(t, p, b)
	})
	sig, err := os.ReadFile(filepath.Join(dir, image.SigName))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, filepath.Join(changed, image.SigName), sig)
	refused("changed image", "does not match its manifest", "restore", "-D", changed, "--trust", alice+".pub")

	// Someone who can write the image changes a file so that its xxh64 stays the same and
	// leaves the signed manifest alone: the manifest's SHA-256 of the file refuses it.
	forged := filepath.Join(t.TempDir(), "forged")
	if err := os.CopyFS(forged, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	p := largestPagesFile(t, forged)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	piece := b[:min(len(b), image.HashChunkSize)]
	imagetest.ForgeXXH64(piece, min(64, len(piece)/32-1), 0xcc)
	testutil.WriteFile(t, p, b)
	refused("forged image", "SHA-256 mismatch", "restore", "-D", forged, "--trust", alice+".pub")
	testutil.WaitReaped(t, w.pid) // the tasks CRIU had made, never resumed, killed, re-parented to the test
	refused("forged image", "SHA-256 mismatch", "verify", forged, "--trust", alice+".pub")

	// The signature travels with the image through a store; a pull under the wrong key
	// leaves nothing behind.
	pulled := filepath.Join(t.TempDir(), "pulled")
	refused("pull under another key", "not among the 1 trusted", "pull", loc, pulled, "--trust", mallory+".pub")
	if _, err := os.Stat(pulled); !os.IsNotExist(err) {
		t.Fatalf("a refused pull left %s: %v", pulled, err)
	}
	var rs restoreDoc
	out = mustGpucr(t, "restore", "-D", pulled, "--from", loc, "--trust", keys, "--json") // a directory of keys
	if err := json.Unmarshal([]byte(out), &rs); err != nil || rs.SignedBy != kg.KeyID {
		t.Fatalf("restore --from --trust: %v\n%s", err, out)
	}
	t.Cleanup(func() { testutil.KillAndReap(rs.RootPID) })
	w.waitCount(t, at+3)
	if v := w.verify(t, rs.RootPID); v != "ok" {
		t.Fatalf("memory after a trusted restore: %s", v)
	}
}

// A streamed checkpoint (no local image) is signed as it is stored, and `gpucr sign` adds
// a second signature to an image, keeping the first.
func TestSignStreamedAndCosign(t *testing.T) {
	needCRIU(t)
	keys := t.TempDir()
	alice, bob := filepath.Join(keys, "alice"), filepath.Join(keys, "bob")
	mustGpucr(t, "keygen", alice)
	mustGpucr(t, "keygen", bob)
	w := startCounter(t, "-mib", "4")
	w.waitCount(t, 2)
	loc := filepath.Join(t.TempDir(), "store", "streamed")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "--to", loc, "--sign", alice, "-R")
	dir := filepath.Join(t.TempDir(), "pulled")
	mustGpucr(t, "pull", loc, dir, "--trust", alice+".pub")
	if out, code := gpucr(t, "verify", dir, "--trust", bob+".pub"); code == 0 {
		t.Fatalf("verify under a key that has not signed: exit 0\n%s", out)
	}
	mustGpucr(t, "sign", dir, "--key", bob)
	for _, k := range []string{alice, bob} {
		mustGpucr(t, "verify", dir, "--trust", k+".pub")
	}
	w.checkRunsOn(t, "a checkpoint with -R")

	// An image checkpointed unsigned gets the SHA-256 of its files when it is signed.
	plain := filepath.Join(t.TempDir(), "plain")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", plain, "-R")
	if out, code := gpucr(t, "verify", plain, "--trust", bob+".pub"); code == 0 {
		t.Fatalf("verify of an unsigned image under a key: exit 0\n%s", out)
	}
	mustGpucr(t, "sign", plain, "--key", bob)
	mustGpucr(t, "verify", plain, "--trust", bob+".pub")
	if m, err := image.Load(plain); err != nil || !m.Digested() {
		t.Fatalf("signed image's manifest: %v", err)
	}
	w.checkRunsOn(t, "a second checkpoint with -R")
}

// `gpucr sign` killed with SIGKILL at each step of its work (GPUCR_TEST_CRASH_AT), the
// rewrite of an unsigned image's manifest included, leaves an image that verifies, and
// signing it again works.
func TestSignKilledAnywhereLeavesAnImage(t *testing.T) {
	needCRIU(t)
	key := filepath.Join(t.TempDir(), "bob")
	mustGpucr(t, "keygen", key)
	w := startCounter(t, "-mib", "16")
	w.waitCount(t, 2)
	plain := filepath.Join(t.TempDir(), "plain")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", plain, "-R")
	for _, at := range []string{
		"sign: files read",
		"replace manifest.sha256: written aside", // the seal of both manifests
		"sign: both manifests sealed",
		"sign: old signatures removed",
		"replace manifest.json: written aside",
		"sign: manifest replaced",
		"replace manifest.sig: written aside",
	} {
		dir := copyImage(t, plain)
		cmd := exec.Command(bin.gpucr, "sign", dir, "--key", key)
		cmd.Env = append(os.Environ(), "GPUCR_TEST_CRASH_AT="+at)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: sign was not killed there (%v): the point is not reached\n%s", at, err, out)
		}
		if out, code := gpucr(t, "verify", dir); code != 0 {
			t.Fatalf("killed at %s: the image does not verify (exit %d)\n%s", at, code, out)
		}
		mustGpucr(t, "sign", dir, "--key", key)
		mustGpucr(t, "verify", dir, "--trust", key+".pub")
	}
	w.checkRunsOn(t, "a checkpoint with -R")
}

// A host with a signing policy (GPUCR_TRUSTED_KEYS and GPUCR_SIGNING_KEY here, for
// /etc/gpucr/trusted-keys and /etc/gpucr/signing-key) signs its checkpoints with its key and
// verifies and restores only images its keys signed, with no flag: an unsigned image is
// refused in one line that says what to do, before anything runs, and --allow-unsigned
// accepts it once.
func TestHostSigningPolicy(t *testing.T) {
	needCRIU(t)
	keys := t.TempDir()
	host, trusted := filepath.Join(keys, "host"), filepath.Join(keys, "trusted-keys")
	mustGpucr(t, "keygen", host)
	if err := os.Mkdir(trusted, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(host+".pub", filepath.Join(trusted, "host.pub")); err != nil {
		t.Fatal(err)
	}
	signs := []string{"GPUCR_TRUSTED_KEYS=" + trusted, "GPUCR_SIGNING_KEY=" + host}
	keyless := []string{"GPUCR_TRUSTED_KEYS=" + trusted, "GPUCR_SIGNING_KEY=" + filepath.Join(keys, "none")}

	w := startCounter(t, "-mib", "4")
	w.waitCount(t, 2)
	pid := strconv.Itoa(w.pid)
	signed, plain := filepath.Join(t.TempDir(), "signed"), filepath.Join(t.TempDir(), "plain")
	var ck checkpointDoc
	decode(t, mustGpucrEnv(t, signs, "checkpoint", pid, "-D", signed, "-R", "--json"), &ck)
	var v verifyDoc
	decode(t, mustGpucrEnv(t, keyless, "verify", signed, "--json"), &v)
	if ck.SignedBy == "" || v.SignedBy != ck.SignedBy {
		t.Fatalf("the host's checkpoint is signed by %q, verified as signed by %q", ck.SignedBy, v.SignedBy)
	}
	w.checkRunsOn(t, "a checkpoint with -R")
	mustGpucrEnv(t, keyless, "checkpoint", pid, "-D", plain)
	testutil.WaitGone(t, w.pid)
	at := w.read(t, "count")

	for _, args := range [][]string{{"restore", "-D", plain}, {"verify", plain}} {
		out, errOut, code := gpucrEnv(t, keyless, args...)
		if code != exitFailed || out != "" || !oneLineWith(errOut, "not signed") || !strings.Contains(errOut, "--allow-unsigned") {
			t.Fatalf("%s of an unsigned image under the host's policy: exit %d, want one line saying what to do:\n%s%s", args[0], code, out, errOut)
		}
	}
	if testutil.Alive(w.pid) {
		t.Fatal("a process of the refused image runs")
	}
	if _, errOut, code := gpucrEnv(t, keyless, "restore", "-D", plain, "--allow-unsigned", "--trust", trusted); code != exitUsage {
		t.Fatalf("--trust with --allow-unsigned: exit %d\n%s", code, errOut)
	}
	var rs restoreDoc
	decode(t, mustGpucrEnv(t, keyless, "restore", "-D", plain, "--allow-unsigned", "--json"), &rs)
	t.Cleanup(func() { testutil.KillAndReap(rs.RootPID) })
	w.waitCount(t, at+2)
}
