package signing

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// hostPolicy makes, in a directory only root can change, a trusted-keys directory holding
// one key's public half, and that key's private half beside it.
func hostPolicy(t *testing.T) (dir, key string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "a host's policy is root's: the test needs root")
	}
	base := t.TempDir()
	dir, key = filepath.Join(base, "trusted-keys"), filepath.Join(base, "signing-key")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(key); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(key+PublicSuffix, filepath.Join(dir, "host"+PublicSuffix)); err != nil {
		t.Fatal(err)
	}
	return dir, key
}

// A host without a policy asks nothing; one with a policy trusts its keys and signs with its
// key; a policy that anyone but root could change, or that names no key, is an error, never
// no policy: a user's key added to it would have root restore what that user signed.
func TestHostPolicy(t *testing.T) {
	dir, key := hostPolicy(t)
	if keys, err := HostTrusted(filepath.Join(dir, "none")); keys != nil || err != nil {
		t.Fatalf("no policy: %v, %v", keys, err)
	}
	if k, err := HostSigningKey(filepath.Join(dir, "none")); k != nil || err != nil {
		t.Fatalf("no signing key: %v, %v", k, err)
	}
	keys, err := HostTrusted(dir)
	if err != nil || len(keys) != 1 {
		t.Fatalf("the policy's keys: %v, %v", keys, err)
	}
	priv, err := HostSigningKey(key)
	if err != nil || priv == nil {
		t.Fatalf("the host's signing key: %v", err)
	}
	if _, err := keys.Check([]byte("m"), Sign(priv, []byte("m"))); err != nil {
		t.Fatalf("the host's key does not sign what its policy trusts: %v", err)
	}

	pub := filepath.Join(dir, "host"+PublicSuffix)
	refused := func(what, want string, undo func()) {
		t.Helper()
		_, err := HostTrusted(dir)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", what, err, want)
		}
		undo()
		if _, err := HostTrusted(dir); err != nil {
			t.Fatalf("after undoing %s: %v", what, err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(dir, 0o777))
	refused("a directory others can write", "writable by users other than root", func() { must(os.Chmod(dir, 0o755)) })
	must(os.Chmod(filepath.Dir(dir), 0o777))
	refused("a parent others can write", "writable by users other than root", func() { must(os.Chmod(filepath.Dir(dir), 0o700)) })
	must(os.Chown(pub, 65534, 65534))
	refused("a key file of another user", "not owned by root", func() { must(os.Chown(pub, 0, 0)) })
	must(os.Chmod(pub, 0o666))
	refused("a key file others can write", "writable by users other than root", func() { must(os.Chmod(pub, 0o644)) })
	must(os.Rename(pub, pub+".real"))
	must(os.Symlink(pub+".real", pub))
	must(os.Lchown(pub, 65534, 65534))
	refused("a key that is another user's symlink", "symlink not owned by root", func() { must(os.Remove(pub)); must(os.Rename(pub+".real", pub)) })
	must(os.Rename(pub, pub+".off"))
	refused("a policy with no key", "no *.pub file", func() { must(os.Rename(pub+".off", pub)) })

	link := filepath.Join(filepath.Dir(dir), "link")
	must(os.Symlink(dir, link))
	if keys, err := HostTrusted(link); err != nil || len(keys) != 1 {
		t.Errorf("a policy directory through root's own symlink: %v, %v", keys, err)
	}
	must(os.Lchown(link, 65534, 65534))
	if _, err := HostTrusted(link); err == nil || !strings.Contains(err.Error(), "symlink not owned by root") {
		t.Errorf("a policy directory through another user's symlink: %v", err)
	}
	must(os.Chmod(key, 0o644))
	if _, err := HostSigningKey(key); err == nil {
		t.Error("a host signing key others can read was taken")
	}
}

// Root signs with, and trusts, only keys that no other user could swap: a key in a
// directory of another user's, or a key file of theirs, is refused, named.
func TestRootUsesOnlyKeysRootOwns(t *testing.T) {
	dir, key := hostPolicy(t)
	pub := filepath.Join(dir, "host"+PublicSuffix)
	users := t.TempDir()
	if err := os.Chown(users, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(users, "key")
	if err := os.Rename(key, theirs); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPrivate(theirs); err == nil || !strings.Contains(err.Error(), "swap in a key of theirs") {
		t.Errorf("a signing key in another user's directory: %v", err)
	}
	if err := os.Chown(pub, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{pub, dir} {
		if _, err := LoadTrusted([]string{p}); err == nil || !strings.Contains(err.Error(), "swap in a key of theirs") {
			t.Errorf("trusting %s, a key of another user's: %v", p, err)
		}
	}
}
