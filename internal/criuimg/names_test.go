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
