package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/testutil"
)

// testImage commits a small container image: CRIU's files, a saved memory run, the
// container description and CRIU's logs, with bytes that tell the files apart.
func testImage(t testing.TB, sign ed25519.PrivateKey) string {
	t.Helper()
	files := map[string][]byte{
		"criu/pstree.img":       []byte("pstree"),
		"criu/pages-1.img":      bytes.Repeat([]byte{7}, 3*4096),
		"criu/pagemap-1.img":    []byte("pagemap"),
		"mem/1-7f0000000.img":   bytes.Repeat([]byte{9}, 2*4096),
		"container.json":        []byte(`{"id":"c1","bundle":"/b"}`),
		"logs/dump.log":         []byte("CRIU said"),
		"logs/" + StatsDump:     []byte("stats"),
		"criu/descriptors.json": []byte(`["/dev/null"]`),
	}
	m := &image.Manifest{RootPID: 1, Processes: []image.Process{{PID: 1, Command: "counter", Threads: 1}}, Created: time.Now()}
	return imagetest.Commit(t, files, m, sign)
}

func testExport() Export {
	return Export{Config: Config{ID: "c1", Runtime: "runc"}, Spec: []byte(`{"ociVersion":"1.0.2"}`)}
}

// export writes dir as an archive named name in a new directory and returns its path.
func export(t testing.TB, dir, name string) string {
	t.Helper()
	m, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), name)
	if _, err := Write(context.Background(), file, "", dir, m, testExport(), CompressionFor(name)); err != nil {
		t.Fatal(err)
	}
	return file
}

// An exported image comes back by import byte for byte, verified, in every compression,
// and its parts are where podman puts them.
func TestExportImportRoundTrip(t *testing.T) {
	dir := testImage(t, nil)
	for _, name := range []string{"c.tar", "c.tar.gz", "c.tar.zst"} {
		t.Run(name, func(t *testing.T) {
			file := export(t, dir, name)
			c, err := Read(file)
			if err != nil {
				t.Fatal(err)
			}
			if c.Compression != CompressionFor(name) || !c.Gpucr || c.Config == nil || c.Config.ID != "c1" {
				t.Errorf("read back as %+v", c)
			}
			if _, err := c.File(CheckpointDir + "/pages-1.img"); err == nil {
				t.Error("inspect held a page file in memory")
			}
			if b, err := c.File(StatsDump); err != nil || string(b) != "stats" {
				t.Errorf("stats-dump at the top: %q, %v", b, err)
			}
			if m, err := c.Manifest(); err != nil || m.RootPID != 1 {
				t.Errorf("manifest from the archive: %v", err)
			}
			out := filepath.Join(t.TempDir(), "imported")
			m, _, err := Import(context.Background(), file, out, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := image.Open(out); err != nil {
				t.Fatalf("imported image does not verify: %v", err)
			}
			for _, f := range append(m.Files, image.File{Path: "logs/dump.log"}) {
				a, _ := os.ReadFile(filepath.Join(dir, f.Path))
				b, err := os.ReadFile(filepath.Join(out, f.Path))
				if err != nil || !bytes.Equal(a, b) {
					t.Errorf("%s differs after the round trip (%v)", f.Path, err)
				}
			}
			if left := leftovers(t, filepath.Dir(out)); !slices.Equal(left, []string{"imported"}) {
				t.Errorf("import left %v beside the image", left)
			}
		})
	}
}

func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// An archive appears whole or not at all: an existing file is never replaced, and an
// export that fails (here, cancelled) leaves neither the file nor its temporary.
func TestWriteIsAtomic(t *testing.T) {
	dir := testImage(t, nil)
	m, err := image.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	existing := filepath.Join(out, "there.tar")
	if err := os.WriteFile(existing, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(context.Background(), existing, "", dir, m, testExport(), None); err == nil {
		t.Error("an existing archive was overwritten")
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep" {
		t.Errorf("existing file now holds %q", b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Write(ctx, filepath.Join(out, "new.tar"), "", dir, m, testExport(), Zstd); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled export: %v", err)
	}
	if left := leftovers(t, out); !slices.Equal(left, []string{"there.tar"}) {
		t.Errorf("a failed export left %v", left)
	}
	if _, err := Write(context.Background(), filepath.Join(out, "missing", "x.tar"), "", dir, m, testExport(), None); err == nil {
		t.Error("an archive in a missing directory was written")
	}
}

// entry is one crafted tar entry.
type entry struct {
	h    tar.Header
	data []byte
}

func reg(name string, data []byte) entry {
	return entry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(data))}, data}
}

// craft builds an archive: the valid export's manifest entries first, then those given.
func craft(t *testing.T, head []entry, es ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range append(slices.Clone(head), es...) {
		if err := tw.WriteHeader(&e.h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// validEntries are the entries of a valid export of dir, in order.
func validEntries(t *testing.T, file string) []entry {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []entry
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out = append(out, entry{*h, data})
	}
}

// Hostile archives are refused in one line, and nothing is written: not at the
// destination, not beside it, not outside it.
func TestHostileArchivesAreRefused(t *testing.T) {
	valid := validEntries(t, export(t, testImage(t, nil), "c.tar"))
	manifest := valid[:4] // the two top directories, the manifest and its seal
	if manifest[2].h.Name != GpucrDir+"/"+image.ManifestName || manifest[3].h.Name != GpucrDir+"/"+image.SealName {
		t.Fatalf("the export does not start with its manifest: %s, %s", manifest[2].h.Name, manifest[3].h.Name)
	}
	rest := valid[4:]
	tampered := slices.Clone(valid)
	for i, e := range tampered {
		if e.h.Name == CheckpointDir+"/pages-1.img" {
			tampered[i].data = bytes.Repeat([]byte{8}, len(e.data))
		}
	}
	var huge bytes.Buffer
	tw := tar.NewWriter(&huge)
	for _, e := range manifest {
		_ = tw.WriteHeader(&e.h)
		_, _ = tw.Write(e.data)
	}
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: CheckpointDir + "/pages-1.img", Mode: 0o600, Size: 1 << 40})
	_ = tw.Flush() // the header is out; its terabyte never follows
	// podman's config.dump, passed over unread: declared 1 TiB, it was read through past
	// every signal (hostile test).
	var hugeSkipped bytes.Buffer
	tw = tar.NewWriter(&hugeSkipped)
	for _, e := range manifest {
		_ = tw.WriteHeader(&e.h)
		_, _ = tw.Write(e.data)
	}
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "config.dump", Mode: 0o600, Size: 1 << 40})
	_ = tw.Flush()
	// Empty logs cost no bytes, but an inode each (hostile test: 200,000 of them).
	var logs []entry
	for i := range maxLogFiles + 1 {
		logs = append(logs, reg(fmt.Sprintf("gpucr/logs/%d.log", i), nil))
	}

	for _, c := range []struct {
		name, want string
		archive    []byte
	}{
		{"parent path", "no place", craft(t, manifest, reg("../evil", []byte("x")))},
		{"parent path inside", "no place", craft(t, manifest, reg("gpucr/../../evil", []byte("x")))},
		{"absolute path", "no place", craft(t, manifest, reg("/tmp/evil", []byte("x")))},
		{"second criu directory", "no place", craft(t, manifest, reg("gpucr/criu/pstree.img", []byte("x")))},
		{"unknown top entry", "no place", craft(t, manifest, reg("rootfs-diff.tar", []byte("x")))},
		{"symlink", "symbolic link", craft(t, manifest, entry{tar.Header{Typeflag: tar.TypeSymlink, Name: "checkpoint/pstree.img", Linkname: "/etc/shadow"}, nil})},
		{"hard link", "hard link", craft(t, manifest, entry{tar.Header{Typeflag: tar.TypeLink, Name: "checkpoint/pstree.img", Linkname: "gpucr/manifest.json"}, nil})},
		{"device", "device", craft(t, manifest, entry{tar.Header{Typeflag: tar.TypeChar, Name: "checkpoint/pstree.img", Devmajor: 1, Devminor: 3}, nil})},
		{"fifo", "FIFO", craft(t, manifest, entry{tar.Header{Typeflag: tar.TypeFifo, Name: "gpucr/mem/x"}, nil})},
		{"huge file", "bytes where the manifest lists", huge.Bytes()},
		{"unlisted file", "not listed", craft(t, manifest, reg("gpucr/extra.bin", []byte("x")))},
		{"file twice", "appears twice", craft(t, valid, reg("checkpoint/pstree.img", []byte("pstree")))},
		{"huge log", "more than", craft(t, manifest, reg("gpucr/logs/x.log", make([]byte, maxLog+1)))},
		{"huge entry passed over", "none of gpucr's or podman's files", hugeSkipped.Bytes()},
		{"many logs", "of CRIU's logs", craft(t, manifest, logs...)},
		{"no manifest", "not a checkpoint gpucr exported", craft(t, nil, rest...)},
		{"manifest after files", "not a checkpoint gpucr exported", craft(t, rest, manifest...)},
		{"file where a directory goes", "a directory where", craft(t, manifest, reg("gpucr/container.json", []byte(`{"id":"c1","bundle":"/b"}`)),
			entry{tar.Header{Typeflag: tar.TypeDir, Name: "gpucr/container.json/x/", Mode: 0o700}, nil})},
		{"tampered pages", "checksum mismatch", craft(t, tampered)},
		{"missing file", "missing", craft(t, valid[:len(valid)-1])},
		{"not a tar", "not a tar archive", bytes.Repeat([]byte("garbage!"), 200)},
		{"bad gzip", "gzip", []byte{0x1f, 0x8b, 0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			file := filepath.Join(root, "in.tar")
			if err := os.WriteFile(file, c.archive, 0o600); err != nil {
				t.Fatal(err)
			}
			sub := filepath.Join(root, "a", "b")
			if err := os.MkdirAll(sub, 0o700); err != nil {
				t.Fatal(err)
			}
			_, _, err := Import(context.Background(), file, filepath.Join(sub, "img"), "", nil)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("import: %v, want one line with %q", err, c.want)
			}
			if left := leftovers(t, sub); len(left) > 0 {
				t.Errorf("a refused import left %v", left)
			}
			if left := leftovers(t, root); !slices.Equal(left, []string{"a", "in.tar"}) {
				t.Errorf("a refused import wrote %v outside its destination", left)
			}
		})
	}
}

// With trusted keys an import takes only an archive signed by one of them, checked before
// the image's files are written, and only the files its signed manifest lists.
func TestImportChecksTheSignature(t *testing.T) {
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	other, _, _ := ed25519.GenerateKey(nil)
	signed := export(t, testImage(t, key), "s.tar")
	out := filepath.Join(t.TempDir(), "img")
	pub := key.Public().(ed25519.PublicKey)
	if _, signer, err := Import(context.Background(), signed, out, "", signing.Keys{signing.ID(pub): pub}); err != nil || signer != signing.ID(pub) {
		t.Fatalf("signed import: %q, %v", signer, err)
	}
	if logs, _ := os.ReadDir(filepath.Join(out, image.LogsDir)); len(logs) != 0 {
		t.Errorf("a trusted import took %d of CRIU's logs, which no signature covers", len(logs))
	}
	out2 := filepath.Join(t.TempDir(), "img")
	if _, _, err := Import(context.Background(), signed, out2, "", signing.Keys{signing.ID(other): other}); !errors.Is(err, signing.ErrUntrusted) {
		t.Fatalf("import with another key trusted: %v", err)
	}
	if _, err := os.Stat(out2); err == nil {
		t.Error("an untrusted import appeared")
	}
}

// A destination that holds something is refused before anything is read.
func TestImportNeverOverwrites(t *testing.T) {
	file := export(t, testImage(t, nil), "c.tar")
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Import(context.Background(), file, out, "", nil); !errors.Is(err, image.ErrNotEmpty) {
		t.Fatalf("import into a non-empty directory: %v", err)
	}
}

// A sparse entry is refused before a byte of it is written: a tar reader hands its holes
// over as zeros, so a 10 KiB archive made a terabyte to write (a hostile test filled a disk
// with one). Entries as GNU tar writes them, in both its sparse formats.
func TestSparseEntriesAreRefused(t *testing.T) {
	gnuTar, err := exec.LookPath("tar")
	if err != nil {
		testutil.SkipOrFail(t, "GNU tar makes the sparse entries: "+err.Error())
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f, 1<<30); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"pax", "gnu"} {
		file := filepath.Join(dir, format+".tar")
		if out, err := exec.Command(gnuTar, "--sparse", "--format="+format, "-C", dir, "-cf", file, "f").CombinedOutput(); err != nil {
			t.Fatalf("tar: %v: %s", err, out)
		}
		r, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		tr := tar.NewReader(r)
		h, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		h.Name = CheckpointDir + "/pages-1.img"
		u := &unpacker{ctx: context.Background(), stage: t.TempDir()}
		var refusal *Refusal
		if err := u.entry(h, tr); !errors.As(err, &refusal) || !strings.Contains(err.Error(), "sparse") {
			t.Errorf("%s sparse entry: %v, want it refused as sparse", format, err)
		}
	}
}

// An archive whose name is a FIFO is refused at once, by import and by inspect's read: the
// open would otherwise wait for a writer for ever, deaf to SIGTERM (a hostile test).
func TestArchivesThatAreFIFOsAreRefused(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "c.tar")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan [2]error, 1)
	go func() {
		_, _, ierr := Import(context.Background(), fifo, filepath.Join(t.TempDir(), "img"), "", nil)
		_, rerr := Read(fifo)
		done <- [2]error{ierr, rerr}
	}()
	select {
	case errs := <-done:
		for _, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("a FIFO as the archive: %v", err)
			}
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reading a FIFO as an archive hangs")
	}
}

// inspect holds the names of the files it keeps as well as their bytes: 2,000 empty files
// named by a megabyte each, in an archive of 86 KB, took 2.8 GB (hostile test).
func TestReadCountsTheNamesItHolds(t *testing.T) {
	// One entry written by the tar writer, then copied with its name's last digits changed:
	// the writer takes 8 ms for a name of 1 MiB, the most the tar reader takes.
	long := strings.Repeat("a", 1<<20-64)
	var one bytes.Buffer
	tw := tar.NewWriter(&one)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: CheckpointDir + "/" + long + "000000.img", Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	digits := bytes.LastIndex(one.Bytes(), []byte("000000.img"))
	file := filepath.Join(t.TempDir(), "c.tar.zst")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	z, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	n := maxHeld/len(long) + 1
	for i := range n {
		copy(one.Bytes()[digits:], fmt.Sprintf("%06d", i))
		if _, err := z.Write(one.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	tw = tar.NewWriter(z)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: CheckpointDir + "/pstree.img", Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []io.Closer{tw, z, f} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Read(file); err == nil || !strings.Contains(err.Error(), "more than 512 MiB") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("read of %d empty files of 1 MiB names: %v, want one line refusing them", n, err)
	}
}

// inspect decompresses what it passes over, so an entry larger than a checkpoint's metadata
// is refused unread unless it is memory or podman's copy of the container's files: one
// declared 200 GiB in 6.5 MB of zstd took it two minutes (hostile test).
func TestReadRefusesHugeEntriesUnread(t *testing.T) {
	for _, c := range []struct {
		name    string
		refused bool
	}{
		{ConfigDump, true},
		{CheckpointDir + "/core-1.img", true},
		{GpucrDir + "/logs/dump.log", true},
		{"../x", true},
		{CheckpointDir + "/pages-1.img", false},
		{CheckpointDir + "/tmpfs-dev-43.tar.gz.img", false},
		{CheckpointDir + "/ghost-file-7.img", false},
		{GpucrDir + "/mem/1-7f0000000.img", false},
		{"rootfs-diff.tar", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: c.name, Mode: 0o600, Size: 200 << 30}); err != nil {
				t.Fatal(err)
			}
			_ = tw.Flush() // the header is out; its 200 GiB never follow
			file := filepath.Join(t.TempDir(), "c.tar")
			if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Read(file)
			if refused := errors.Is(err, ErrRefused) && strings.Contains(err.Error(), "more than 64 MiB"); refused != c.refused {
				t.Errorf("read of an entry declared 200 GiB: %v, want refused unread: %v", err, c.refused)
			}
		})
	}
}

// Zeros are written as holes: an image's memory holds many, and a compressed archive of
// zeros is tiny, so they cost the disk nothing. The image still verifies.
func TestImportWritesZerosAsHoles(t *testing.T) {
	const size = 16 << 20
	files := map[string][]byte{
		"criu/pstree.img":     []byte("pstree"),
		"mem/1-7f0000000.img": append(make([]byte, size-1), 1),
		"container.json":      []byte(`{"id":"c1","bundle":"/b"}`),
	}
	dir := imagetest.Commit(t, files, &image.Manifest{RootPID: 1, Processes: []image.Process{{PID: 1, Command: "c", Threads: 1}}, Created: time.Now()}, nil)
	out := filepath.Join(t.TempDir(), "imported")
	if _, _, err := Import(context.Background(), export(t, dir, "c.tar.zst"), out, "", nil); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(out, "mem", "1-7f0000000.img"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 > 2*copyBlock {
		t.Errorf("the imported memory file: %d bytes in %d blocks of 512, want %d bytes, all but its last MiB a hole", st.Size, st.Blocks, size)
	}
	if _, err := image.Open(out); err != nil {
		t.Fatal(err)
	}
}

// Import stops before it leaves a file system with less than 5% of it (at most 1 GiB) free.
func TestRoomLeft(t *testing.T) {
	dir := testutil.SmallTmpfs(t, "32m")
	if err := roomLeft("f", dir); err != nil {
		t.Fatalf("an empty file system: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), bytes.Repeat([]byte{1}, 31<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var refusal *Refusal
	if err := roomLeft("f", dir); !errors.As(err, &refusal) || !strings.Contains(err.Error(), "kept for others") {
		t.Fatalf("a file system 31/32 full: %v", err)
	}
}

// Root exports only into a directory others cannot change: a user who could rename in it
// swapped gpucr's archive for their own while it was written (a hostile test).
func TestCheckDestRefusesADirectoryOthersCanChange(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "the rule is root's: the test needs root")
	}
	for _, tc := range []struct {
		name  string
		set   func(dir string) error
		taken bool
	}{
		{"root's, 0700", func(dir string) error { return os.Chmod(dir, 0o700) }, true},
		{"root's, sticky and writable by all", func(dir string) error { return os.Chmod(dir, os.ModeSticky|0o777) }, true},
		{"writable by all", func(dir string) error { return os.Chmod(dir, 0o777) }, false},
		{"another user's", func(dir string) error { return os.Chown(dir, 65534, 65534) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.set(dir); err != nil {
				t.Fatal(err)
			}
			err := CheckDest(filepath.Join(dir, "x.tar"))
			if tc.taken && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.taken && (err == nil || !strings.Contains(err.Error(), "only root can change")) {
				t.Fatalf("taken, or an unclear refusal: %v", err)
			}
		})
	}
}
