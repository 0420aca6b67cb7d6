package hosttune

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// The kernel shows the mode in brackets and takes a bare word; a file stands in for it here.
func TestTHPAlwaysSetsAndRestores(t *testing.T) {
	for _, c := range []struct{ before, during, after string }{
		{"always [madvise] never\n", "always", "madvise"},
		{"always madvise [never]\n", "always", "never"},
		{"[always] madvise never\n", "[always] madvise never\n", "[always] madvise never\n"},
	} {
		p := filepath.Join(t.TempDir(), "enabled")
		if err := os.WriteFile(p, []byte(c.before), 0o644); err != nil {
			t.Fatal(err)
		}
		var recorded string
		restore, err := THPAlways(p, func(prev string) error { recorded = prev; return nil })
		if err != nil {
			t.Fatal(err)
		}
		if c.during == "always" && recorded != c.after {
			t.Errorf("%q: recorded %q before the change, want %q", c.before, recorded, c.after)
		}
		if b, _ := os.ReadFile(p); string(b) != c.during {
			t.Errorf("%q: during = %q, want %q", c.before, b, c.during)
		}
		if err := restore(); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != c.after {
			t.Errorf("%q: after = %q, want %q", c.before, b, c.after)
		}
	}
}

func TestTHPMissingOrGarbled(t *testing.T) {
	restore, err := THPAlways(filepath.Join(t.TempDir(), "absent"), nil)
	if err != nil || restore() != nil {
		t.Fatalf("a kernel without THP must be left alone: %v", err)
	}
	p := filepath.Join(t.TempDir(), "enabled")
	if err := os.WriteFile(p, []byte("always madvise never"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := THPAlways(p, nil); err == nil {
		t.Fatal("a mode line without a selection must be an error")
	}
}

// A journal records the old mode before THP changes; where the change then failed (a
// read-only /sys), the rollback failed on every try and the record was never removed
// (review). A mode that is already the old one needs no write.
func TestPutBackLeavesAModeThatNeverChanged(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root to mount a read-only switch")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		testutil.SkipOrFail(t, "mount tmpfs: "+err.Error())
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	p := filepath.Join(dir, "enabled")
	if err := os.WriteFile(p, []byte("always [madvise] never\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	var recorded string
	if _, err := THPAlways(p, func(prev string) error { recorded = prev; return nil }); err == nil || recorded != "madvise" {
		t.Fatalf("THPAlways on a read-only switch = %v, recorded %q; want the failure, madvise recorded first", err, recorded)
	}
	if err := PutBack(p, "madvise"); err != nil {
		t.Errorf("PutBack of the mode the switch has = %v, want nothing to do", err)
	}
	if err := PutBack(p, "never"); err == nil {
		t.Error("PutBack of another mode on a read-only switch succeeded")
	}
}
