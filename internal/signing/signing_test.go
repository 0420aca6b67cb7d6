package signing

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSignAndCheck(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if _, err := Generate(a); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(b); err != nil {
		t.Fatal(err)
	}
	key, err := LoadPrivate(a)
	if err != nil {
		t.Fatal(err)
	}
	onlyA, err := LoadTrusted([]string{a + PublicSuffix})
	if err != nil {
		t.Fatal(err)
	}
	onlyB, err := LoadTrusted([]string{b + PublicSuffix})
	if err != nil {
		t.Fatal(err)
	}
	both, err := LoadTrusted([]string{dir})
	if err != nil || len(both) != 2 {
		t.Fatalf("a directory of keys: %v, %d keys", err, len(both))
	}
	manifest := []byte(`{"files":[]}`)
	sig := Sign(key, manifest)
	for name, keys := range map[string]Keys{"its key": onlyA, "a directory": both} {
		if id, err := keys.Check(manifest, sig); err != nil || id != ID(key.Public().(ed25519.PublicKey)) {
			t.Errorf("%s: %q, %v", name, id, err)
		}
	}
	cases := map[string]struct {
		keys     Keys
		manifest []byte
		sig      []byte
		want     string
	}{
		"another key":       {onlyB, manifest, sig, "not among the 1 trusted"},
		"changed manifest":  {onlyA, []byte(`{"files":[1]}`), sig, "does not match"},
		"no signature":      {onlyA, manifest, nil, "not signed"},
		"malformed":         {onlyA, manifest, []byte("rsa x y\n"), "no well-formed signature"},
		"bad base64":        {onlyA, manifest, []byte("ed25519 " + ID(key.Public().(ed25519.PublicKey)) + " !!!\n"), "no well-formed signature"},
		"signature swapped": {onlyA, manifest, Sign(mustKey(t, b), manifest), "not among"},
	}
	for name, c := range cases {
		_, err := c.keys.Check(c.manifest, c.sig)
		if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	// A second signature by another key is skipped, not a failure; so is a line that is no
	// signature, wherever it is (a note someone added must not void the signatures).
	if _, err := onlyA.Check(manifest, append(Sign(mustKey(t, b), manifest), sig...)); err != nil {
		t.Errorf("two signatures: %v", err)
	}
	noted := append([]byte("# re-signed by ops, ticket 42\n"), sig...)
	if _, err := onlyA.Check(manifest, noted); err != nil {
		t.Errorf("a note before the signature: %v", err)
	}
	// Others keeps the other keys' well-formed lines only.
	idA := ID(key.Public().(ed25519.PublicKey))
	two := append(Sign(mustKey(t, b), manifest), noted...)
	if kept := Others(two, idA); len(IDs(kept)) != 1 || IDs(kept)[0] == idA || strings.Contains(string(kept), "#") {
		t.Errorf("Others of B's, a note and A's signature: %q", kept)
	}
}

func TestKeysOthersCanReadAreRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "k")
	if _, err := Generate(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPrivate(p); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("LoadPrivate of a 0640 key: %v", err)
	}
	if _, err := Generate(p); err == nil {
		t.Fatal("Generate overwrote an existing key")
	}
	// The public key handed where the private one belongs is named as what it is.
	if _, err := LoadPrivate(p + PublicSuffix); err == nil || !strings.Contains(err.Error(), "is a public key") {
		t.Fatalf("LoadPrivate of the public key: %v", err)
	}
}

// Keys made by OpenSSL are accepted, and a signature gpucr makes verifies with OpenSSL: the
// formats are the common ones, not gpucr's own.
func TestOpenSSLKeys(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl is not installed")
	}
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k.pem"), filepath.Join(dir, "k.pub")
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(openssl, args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v\n%s", args, err, out)
		}
	}
	run("genpkey", "-algorithm", "ed25519", "-out", priv)
	run("pkey", "-in", priv, "-pubout", "-out", pub)
	if err := os.Chmod(priv, 0o600); err != nil {
		t.Fatal(err)
	}
	key := mustKey(t, priv)
	keys, err := LoadTrusted([]string{pub})
	if err != nil {
		t.Fatal(err)
	}
	manifest := []byte("manifest bytes\n")
	sig := Sign(key, manifest)
	if _, err := keys.Check(manifest, sig); err != nil {
		t.Fatal(err)
	}
	// OpenSSL checks the raw signature gpucr wrote against the same bytes.
	raw := filepath.Join(dir, "sig")
	msg := filepath.Join(dir, "msg")
	b64 := strings.Fields(string(sig))[2]
	if err := os.WriteFile(msg, manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	decoded, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(raw, decoded, 0o600); err != nil {
		t.Fatal(err)
	}
	run("pkeyutl", "-verify", "-pubin", "-inkey", pub, "-rawin", "-in", msg, "-sigfile", raw)
}

func mustKey(t *testing.T, path string) ed25519.PrivateKey {
	t.Helper()
	k, err := LoadPrivate(path)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A key whose writing was cut short (gpucr killed between making the file and writing
// it) stayed empty where it goes, and blocked keygen there and every sign with it (hostile
// test). Keys are written aside and linked into place: a kill leaves no key's name taken.
func TestKeygenKilledLeavesNoKeyBehind(t *testing.T) {
	if path := os.Getenv("GPUCR_TEST_KEYGEN_KILLED"); path != "" {
		keyFileMade = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
		_, _ = Generate(path)
		return
	}
	path := filepath.Join(t.TempDir(), "k")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeygenKilledLeavesNoKeyBehind$")
	cmd.Env = append(os.Environ(), "GPUCR_TEST_KEYGEN_KILLED="+path)
	_ = cmd.Run() // killed
	if _, err := os.Lstat(path); err == nil {
		t.Fatal("a keygen killed while it wrote left a file at the key's path")
	}
	if _, err := Generate(path); err != nil {
		t.Fatalf("keygen at the path again: %v", err)
	}
	if _, err := LoadPrivate(path); err != nil {
		t.Fatal(err)
	}
}

// A key that is no key file is refused at once: a FIFO among a trusted directory's *.pub
// (or as the signing key) hung verify, sign, pull and restore in open(2), and a key file of
// gigabytes was read whole into memory (hostile test).
func TestKeyFilesThatAreNoKeysAreRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.pub")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // lets a reader blocked in open(2) go, where the test failed
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	huge := filepath.Join(dir, "huge.pub")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 1<<30); err != nil {
		t.Fatal(err)
	}
	for name, load := range map[string]func() error{
		"FIFO trusted":          func() error { _, err := LoadTrusted([]string{fifo}); return err },
		"FIFO in a trusted dir": func() error { _, err := LoadTrusted([]string{dir}); return err },
		"FIFO signing key":      func() error { _, err := LoadPrivate(fifo); return err },
		"huge trusted":          func() error { _, err := LoadTrusted([]string{huge}); return err },
	} {
		done := make(chan error, 1)
		go func() { done <- load() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") && !strings.Contains(err.Error(), "more than a key's") {
				t.Errorf("%s: %v, want it refused as no key file", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s: still loading after 5s", name)
		}
	}
}
