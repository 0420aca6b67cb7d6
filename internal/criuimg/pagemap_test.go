package criuimg

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"
)

// A pagemap CRIU wrote reads, and written again is the same bytes: gpucr's pagemaps (the
// page server's, memfill's view) are what CRIU itself would write.
func TestPagemapOfARealDump(t *testing.T) {
	dir, _ := dumpTree(t)
	maps, err := filepath.Glob(filepath.Join(dir, PagemapGlob))
	if err != nil || len(maps) == 0 {
		t.Fatalf("no pagemaps in the dump (%v)", err)
	}
	out := t.TempDir()
	for _, path := range maps {
		pm, err := ReadPagemap(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(pm.Entries) == 0 {
			t.Errorf("%s: no entries", filepath.Base(path))
		}
		var present int64
		for _, e := range pm.Entries {
			if Present(e) {
				present += int64(e.GetNrPages()) * PageSize
			}
		}
		if fi, err := os.Stat(filepath.Join(dir, pm.PagesName())); err != nil || fi.Size() != present {
			t.Errorf("%s lists %d bytes of present pages; %s: %v, %v", filepath.Base(path), present, pm.PagesName(), fi, err)
		}
		again := filepath.Join(out, filepath.Base(path))
		if err := WritePagemap(again, pm); err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(path)
		if got, err := os.ReadFile(again); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s written again differs: %x, CRIU wrote %x (%v)", filepath.Base(path), got, want, err)
		}
	}
}

func TestReadPagemapRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string][]byte{
		"pagemap-1.img": nil,
		"pagemap-2.img": {0x19, 0x43, 0x56, 0x54, 0x25, 0x40, 0x08, 0x56}, // the magics, no head
		"pagemap-3.img": {0x19, 0x43, 0x56, 0x54, 0x25, 0x40, 0x08, 0x56, 0xff, 0xff, 0xff, 0x7f},
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if pm, err := ReadPagemap(path); err == nil || !strings.HasPrefix(err.Error(), "read "+name+": ") {
			t.Errorf("ReadPagemap(%s) = %v, %v; want an error naming it", name, pm, err)
		}
	}
	if err := WritePagemap(filepath.Join(dir, "pagemap-1.img"), &Pagemap{Head: &pagemap.PagemapHead{PagesId: proto.Uint32(1)}}); !errors.Is(err, fs.ErrExist) {
		t.Errorf("WritePagemap over an existing file = %v, want it refused", err)
	}
}

func TestPresent(t *testing.T) {
	u32, yes, no := proto.Uint32, proto.Bool(true), proto.Bool(false)
	for _, tc := range []struct {
		e    *pagemap.PagemapEntry
		want bool
	}{
		{&pagemap.PagemapEntry{Flags: u32(PEPresent)}, true},
		{&pagemap.PagemapEntry{Flags: u32(PEPresent | PEParent), InParent: yes}, true},
		{&pagemap.PagemapEntry{Flags: u32(PEParent)}, false},
		{&pagemap.PagemapEntry{Flags: u32(PELazy)}, false},
		{&pagemap.PagemapEntry{Flags: u32(0)}, false},
		// Written before CRIU had flags: present unless in the parent.
		{&pagemap.PagemapEntry{}, true},
		{&pagemap.PagemapEntry{InParent: no}, true},
		{&pagemap.PagemapEntry{InParent: yes}, false},
	} {
		if got := Present(tc.e); got != tc.want {
			t.Errorf("Present(%v) = %v, want %v", tc.e, got, tc.want)
		}
	}
}

// An image of empty entries — its zeros a hole, 4 KiB on disk for 256 MiB — cost 5.3 GB
// of memory decoded in a hostile test: it is refused at its first entry, having read and
// kept next to nothing.
func TestEmptyEntriesAreRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pagemap-1.img")
	magics := []byte{0x19, 0x43, 0x56, 0x54, 0x25, 0x40, 0x08, 0x56}
	if err := os.WriteFile(path, magics, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, maxImage); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadPagemap(path)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "empty entry at offset 8") {
		t.Fatalf("ReadPagemap = %v, want the empty entry refused", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("refusing it allocated %d bytes", n)
	}
}
