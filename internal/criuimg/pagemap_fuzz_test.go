package criuimg

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
)

func pmEntry(vaddr uint64, pages, flags uint32) *pagemap.PagemapEntry {
	return &pagemap.PagemapEntry{Vaddr: proto.Uint64(vaddr), NrPages: proto.Uint32(pages), Flags: proto.Uint32(flags)}
}

// samplePagemap is a pagemap as CRIU writes one: present runs, a run CRIU left in the
// parent image, a lazy run.
func samplePagemap() []*pagemap.PagemapEntry {
	return []*pagemap.PagemapEntry{
		pmEntry(0x400000, 4, PEPresent),
		pmEntry(0x600000, 2, PEParent),
		pmEntry(0x7f0000000000, 512, PEPresent),
		pmEntry(0x7f0000200000, 512, PEPresent),
		pmEntry(0x7fff00000000, 8, PELazy),
	}
}

// A pagemap comes from the image. ReadPagemap returns it or an error, allocating in
// proportion to the file; and what it returns, WritePagemap writes as crit encodes it and
// it reads back unchanged.
func FuzzReadPagemap(f *testing.F) {
	good := fuzzcheck.Pagemap(f, 3, samplePagemap()...)
	f.Add(good)
	f.Add(fuzzcheck.Pagemap(f, 1))
	f.Add(fuzzcheck.Pagemap(f, 7, &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1)})) // no flags
	f.Add(fuzzcheck.Pagemap(f, 1, pmEntry(0x1000, math.MaxUint32, PEPresent)))
	f.Add(good[:8])
	f.Add(good[:len(good)-2])
	f.Add(append(slices.Clone(good[:8]), 0xfe, 0xff, 0xff, 0xff, 8, 1))
	f.Add([]byte{})
	dir := f.TempDir()
	path := filepath.Join(dir, "pagemap-1.img")
	if err := os.WriteFile(path, good, 0o600); err != nil {
		f.Fatal(err)
	}
	if pm, err := ReadPagemap(path); err != nil || pm.Head.GetPagesId() != 3 || len(pm.Entries) != len(samplePagemap()) {
		f.Fatalf("the sample pagemap reads as %v, %v", pm, err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var pm *Pagemap
		var err error
		if n := fuzzcheck.Allocated(func() { pm, err = ReadPagemap(path) }); n > fuzzcheck.AllocSlack+uint64(512*len(data)) {
			t.Fatalf("ReadPagemap allocated %d bytes for a %d-byte pagemap", n, len(data))
		}
		if err != nil {
			if pm != nil {
				t.Fatalf("ReadPagemap returned a pagemap and the error %v", err)
			}
			return
		}
		if pm.Head == nil {
			t.Fatal("ReadPagemap returned no head and no error")
		}

		again := filepath.Join(dir, "again.img")
		os.Remove(again)
		if err := WritePagemap(again, pm); err != nil {
			t.Fatalf("WritePagemap of what ReadPagemap read: %v", err)
		}
		written, err := os.ReadFile(again)
		if err != nil {
			t.Fatal(err)
		}
		msgs := []proto.Message{pm.Head}
		for _, e := range pm.Entries {
			msgs = append(msgs, e)
		}
		if want := fuzzcheck.Image(t, "PAGEMAP", msgs...); !bytes.Equal(written, want) {
			t.Fatalf("WritePagemap wrote %x, crit encodes %x", written, want)
		}
		pm2, err := ReadPagemap(again)
		if err != nil || !proto.Equal(pm.Head, pm2.Head) || len(pm.Entries) != len(pm2.Entries) {
			t.Fatalf("read back %v, %v; wrote %v", pm2, err, pm)
		}
		for i := range pm.Entries {
			if !proto.Equal(pm.Entries[i], pm2.Entries[i]) {
				t.Fatalf("entry %d read back as %v, wrote %v", i, pm2.Entries[i], pm.Entries[i])
			}
		}
	})
}
