package criuimg

import (
	"path"
	"testing"
)

// The names are CRIU's (criu/image-desc.c), and the globs match what the builders make.
func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want, glob string }{
		{PagemapName(4242), "pagemap-4242.img", PagemapGlob},
		{ShmemPagemapName(1 << 40), "pagemap-shmem-1099511627776.img", PagemapGlob},
		{PagesName(65537), "pages-65537.img", PagesGlob},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
		if ok, err := path.Match(tc.glob, tc.got); !ok || err != nil {
			t.Errorf("%s does not match %s", tc.got, tc.glob)
		}
	}
}

func TestIsPagesName(t *testing.T) {
	for name, want := range map[string]bool{
		"pages-1.img":             true,
		"pages-65537.img":         true,
		"pagemap-1.img":           false,
		"amdgpu-pages-7-0001.img": false,
		"pages-1":                 false,
		"core-1.img":              false,
	} {
		if got := IsPagesName(name); got != want {
			t.Errorf("IsPagesName(%q) = %v, want %v", name, got, want)
		}
	}
}

// A name MemName makes reads back as what it names; ParseMemName refuses anything else a
// manifest may hold there.
func TestMemNames(t *testing.T) {
	if got := MemName(42, 0x7f0000000000); got != "42-7f0000000000.img" {
		t.Errorf("MemName = %s", got)
	}
	for _, tc := range []struct {
		name  string
		pid   int
		start uint64
		ok    bool
	}{
		{"42-7f0000000000.img", 42, 0x7f0000000000, true},
		{"42-0.img", 42, 0, true},
		{"42-ffffffffffffffff.img", 42, 1<<64 - 1, true},
		{"+42-1000.img", 42, 0x1000, true}, // as strconv reads a PID
		{"42-1000", 0, 0, false},
		{"42-0x1000.img", 0, 0, false},
		{"42-10000000000000000.img", 0, 0, false},
		{"-1000.img", 0, 0, false},
		{"42.img", 0, 0, false},
		{"pages-1.img", 0, 0, false},
	} {
		pid, start, ok := ParseMemName(tc.name)
		if pid != tc.pid || start != tc.start || ok != tc.ok {
			t.Errorf("ParseMemName(%q) = %d, %#x, %v; want %d, %#x, %v", tc.name, pid, start, ok, tc.pid, tc.start, tc.ok)
		}
		if ok && tc.name[0] != '+' && MemName(pid, start) != tc.name {
			t.Errorf("%q reads as %d, %#x, which MemName names %s", tc.name, pid, start, MemName(pid, start))
		}
	}
}
