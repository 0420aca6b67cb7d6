package criufold

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/image"
)

const vmaAnonPrivate = 1 << 9 // criu/include/image.h

func vmaEntry(start, end uint64, prot uint32) *vma.VmaEntry {
	return &vma.VmaEntry{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
		Prot: proto.Uint32(prot), Flags: proto.Uint32(0x22), Status: proto.Uint32(vmaAnonPrivate | 1), Fd: proto.Int64(-1)}
}

func pe(addr uint64, pages uint32, flags uint32) proto.Message {
	return &pagemap.PagemapEntry{Vaddr: proto.Uint64(addr), NrPages: proto.Uint32(pages), Flags: proto.Uint32(flags)}
}

const page = criuimg.PageSize

// testImage commits an image of process 1: CRIU's pagemap lists 4 present pages at
// 0x10000 and 2 in a parent image at 0x20000; mem/ holds the files of extra, by name. The
// mm image has writable private anonymous mappings at 0x10000 and 0x40000 (8 MiB) and a
// read-only one at 0x1000000.
func testImage(t *testing.T, extra map[string][]byte, more ...func(criuDir string)) (string, *image.Manifest) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	s, err := image.Begin(dir)
	if err != nil {
		t.Fatal(err)
	}
	zero := proto.Uint64(0)
	files := map[string][]byte{
		"criu/pagemap-1.img": fuzzcheck.Image(t, "PAGEMAP", &pagemap.PagemapHead{PagesId: proto.Uint32(1)},
			pe(0x10000, 4, criuimg.PEPresent), pe(0x20000, 2, criuimg.PEParent)),
		"criu/pages-1.img": bytes.Repeat([]byte{0xaa}, 4*page),
		"criu/mm-1.img": fuzzcheck.Image(t, "MM", &mm.MmEntry{
			MmStartCode: zero, MmEndCode: zero, MmStartData: zero, MmEndData: zero, MmStartStack: zero, MmStartBrk: zero,
			MmBrk: zero, MmArgStart: zero, MmArgEnd: zero, MmEnvStart: zero, MmEnvEnd: zero, ExeFileId: proto.Uint32(1),
			Vmas: []*vma.VmaEntry{vmaEntry(0x10000, 0x30000, 3), vmaEntry(0x40000, 0x840000, 3), vmaEntry(0x1000000, 0x1010000, 1)}}),
		"criu/pstree.img": []byte("pstree"),
		"logs/dump.log":   []byte("CRIU said"),
	}
	for name, b := range extra {
		files["mem/"+name] = b
	}
	for p, b := range files {
		full := filepath.Join(s.Dir(), p)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range more {
		f(s.CRIUDir())
	}
	if err := s.Commit(&image.Manifest{RootPID: 1, Processes: []image.Process{{PID: 1}}}); err != nil {
		t.Fatal(err)
	}
	m, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, m
}

// A run of mem/ goes into the pagemap in address order beside CRIU's own entries, cut in
// entries of at most entryPages, and its bytes into the pages file where those entries
// say, zeros included; the rest of the image is copied as it was.
func TestFoldPutsMemIntoCRIUsFiles(t *testing.T) {
	run := make([]byte, (entryPages+8)*page)
	for i := range run[:len(run)/2] {
		run[i] = byte(i/page + 1)
	}
	src, m := testImage(t, map[string][]byte{"1-40000.img": run})
	dst := filepath.Join(t.TempDir(), "folded")
	res, err := Fold(context.Background(), src, m, dst, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Runs != 1 || res.Bytes != int64(len(run)) {
		t.Errorf("result %+v", res)
	}
	if _, err := image.Open(dst); err != nil {
		t.Fatalf("the folded image does not verify: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "mem")); err == nil {
		t.Error("the folded image has a mem/")
	}
	if b, err := os.ReadFile(filepath.Join(dst, "logs", "dump.log")); err != nil || string(b) != "CRIU said" {
		t.Errorf("CRIU's log: %q, %v", b, err)
	}
	pm, err := criuimg.ReadPagemap(filepath.Join(dst, "criu", "pagemap-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		addr  uint64
		pages uint32
		flags uint32
	}
	wants := []want{{0x10000, 4, criuimg.PEPresent}, {0x20000, 2, criuimg.PEParent},
		{0x40000, entryPages, criuimg.PEPresent}, {0x40000 + entryPages*page, 8, criuimg.PEPresent}}
	if len(pm.Entries) != len(wants) {
		t.Fatalf("folded pagemap has %d entries, want %d", len(pm.Entries), len(wants))
	}
	for i, w := range wants {
		e := pm.Entries[i]
		if e.GetVaddr() != w.addr || e.GetNrPages() != w.pages || e.GetFlags() != w.flags {
			t.Errorf("entry %d: %#x %d pages flags %d, want %+v", i, e.GetVaddr(), e.GetNrPages(), e.GetFlags(), w)
		}
	}
	pages, err := os.ReadFile(filepath.Join(dst, "criu", "pages-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	if wantPages := append(bytes.Repeat([]byte{0xaa}, 4*page), run...); !bytes.Equal(pages, wantPages) {
		t.Errorf("folded pages file: %d bytes, not CRIU's pages then the run", len(pages))
	}
}

// What CRIU could not restore, or that would overwrite CRIU's own pages, is refused, and
// nothing appears at the destination.
func TestFoldRefusesWhatCRIUCouldNotTake(t *testing.T) {
	for _, c := range []struct {
		name  string
		extra map[string][]byte
		more  func(string)
	}{
		{"overlaps CRIU's pages", map[string][]byte{"1-10000.img": make([]byte, 2*page)}, nil},
		{"read-only mapping", map[string][]byte{"1-1000000.img": make([]byte, 2*page)}, nil},
		{"outside every mapping", map[string][]byte{"1-900000.img": make([]byte, 2*page)}, nil},
		{"shared pages file", map[string][]byte{"1-40000.img": make([]byte, 2*page)}, func(criuDir string) {
			b := fuzzcheck.Image(t, "PAGEMAP", &pagemap.PagemapHead{PagesId: proto.Uint32(1)})
			if err := os.WriteFile(filepath.Join(criuDir, "pagemap-shmem-5.img"), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var more []func(string)
			if c.more != nil {
				more = append(more, c.more)
			}
			src, m := testImage(t, c.extra, more...)
			out := t.TempDir()
			_, err := Fold(context.Background(), src, m, filepath.Join(out, "folded"), "")
			if !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("fold: %v, want a corrupt-image refusal", err)
			}
			if es, _ := os.ReadDir(out); len(es) > 0 {
				t.Errorf("a refused fold left %v", es)
			}
		})
	}
}

// A file of the image swapped, after the image was verified, for a symlink to a file of
// root's or for a FIFO is not copied into the folded image: not read, and not waited on
// (a hostile test had fold copy a root-only file into a new image that then verified).
func TestCopyFileFollowsNoSymlink(t *testing.T) {
	src, out := t.TempDir(), t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(src, "link.img")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo.img"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"link.img", "fifo.img"} {
		done := make(chan error, 1)
		go func() {
			done <- copyFile(context.Background(), src, name, filepath.Join(out, name))
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("copyFile of %s succeeded", name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("copyFile of %s hangs", name)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "link.img")); err == nil {
		t.Errorf("the secret was copied: %q", b)
	}
}

// A fold copied a file of holes byte for byte: 4 GiB of disk for an image of 21 MiB
// (hostile test). Holes stay holes; and a fold that would not fit where it writes is
// refused before a byte is written.
func TestFoldKeepsHolesAndChecksRoom(t *testing.T) {
	src, m := testImage(t, nil, func(criuDir string) {
		f, err := os.Create(filepath.Join(criuDir, "zz.img"))
		if err == nil {
			err = errors.Join(f.Truncate(1<<30), f.Close())
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	dst := filepath.Join(t.TempDir(), "folded")
	if _, err := Fold(context.Background(), src, m, dst, ""); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "criu", "zz.img"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 1<<30 || st.Blocks*512 > 1<<20 {
		t.Fatalf("the fold's copy of a 1 GiB file of holes: size %d, %d bytes on disk; want the size, holes kept", st.Size, st.Blocks*512)
	}

	if os.Geteuid() != 0 {
		return // mounting a small file system needs root
	}
	big, bm := testImage(t, nil, func(criuDir string) {
		if err := os.WriteFile(filepath.Join(criuDir, "data.img"), bytes.Repeat([]byte{1}, 4<<20), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
	if _, err := Fold(context.Background(), big, bm, filepath.Join(small, "folded"), ""); !strings.Contains(fmt.Sprint(err), "to write into") {
		t.Fatalf("fold of 4 MiB into a 2 MiB file system = %v, want it refused for room", err)
	}
	if entries, _ := os.ReadDir(small); len(entries) != 0 {
		t.Errorf("the refused fold left %d entries", len(entries))
	}
}

// A run with one byte set in each MiB took a MiB of the folded pages file's disk for
// each, 256 times the room the fold's check counted (review): its zero pages stay holes.
func TestFoldWritesNoZeroPages(t *testing.T) {
	run := make([]byte, 8<<20)
	for i := 0; i < len(run); i += 1 << 20 {
		run[i] = 1
	}
	src, m := testImage(t, map[string][]byte{"1-40000.img": run})
	dst := filepath.Join(t.TempDir(), "folded")
	if _, err := Fold(context.Background(), src, m, dst, ""); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "criu", "pages-1.img"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("the folded pages file takes %d bytes of disk for 12 pages of data", st.Blocks*512)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "criu", "pages-1.img")); err != nil || !bytes.Equal(b[4*page:], run) {
		t.Fatalf("the folded pages file does not hold the run: %v", err)
	}

}

// A file that shrank after its first run of data was copied read as holes to its old end:
// its copy came out padded with zeros, and sealed (review). An error instead.
func TestCopyOfAFileThatShrankFails(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, at := range []int64{0, 8 << 20} {
		if _, err := f.WriteAt([]byte("data"), at); err != nil {
			t.Fatal(err)
		}
	}
	in, out := copyEnds(t, src)
	afterRange = func() { _ = f.Truncate(4096) } // shrunk once its first run was copied
	defer func() { afterRange = nil }()
	if err := copyData(in, out); err == nil {
		st, _ := out.Stat()
		t.Fatalf("a copy of a file that shrank to 4096 bytes while copied: %d bytes, no error", st.Size())
	}
}

// copyEnds opens src to copy from and a new file to copy into, both closed at the test's end.
func copyEnds(t *testing.T, src string) (in, out *os.File) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	out, err = os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = out.Close() })
	return in, out
}
