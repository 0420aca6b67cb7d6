package hosttune

import (
	"os"
	"path/filepath"
	"testing"
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
