// Package fuzzcheck holds what the fuzz tests of several packages share: a measure of the
// heap a call allocates, to catch a parser that allocates what a length field claims, and
// CRIU images built with go-criu's own encoder, as seeds in the shape CRIU writes.
package fuzzcheck

import (
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"
)

// AllocSlack is what a check allows besides what the input explains: Allocated counts
// small allocations when their span is refilled, which may include some made before.
const AllocSlack = 32 << 20

// Allocated is how many heap bytes fn allocates. Large allocations are counted exactly.
func Allocated(fn func()) uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	before := s[0].Value.Uint64()
	fn()
	metrics.Read(s)
	return s[0].Value.Uint64() - before
}

// Image is what CRIU (and crit's encoder) writes for an image of msgs with magic.
func Image(t testing.TB, magic string, msgs ...proto.Message) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	img := &crit.CriuImage{Magic: magic}
	for _, m := range msgs {
		img.Entries = append(img.Entries, &crit.CriuEntry{Message: m})
	}
	if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Pagemap is the pagemap image CRIU writes for a pages file pagesID and entries.
func Pagemap(t testing.TB, pagesID uint32, entries ...*pagemap.PagemapEntry) []byte {
	t.Helper()
	msgs := []proto.Message{&pagemap.PagemapHead{PagesId: proto.Uint32(pagesID)}}
	for _, e := range entries {
		msgs = append(msgs, e)
	}
	return Image(t, "PAGEMAP", msgs...)
}
