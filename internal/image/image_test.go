package image

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/gpucr/gpucr/internal/testutil"
)

// stagedFiles is what the tests put in an image: nested, empty and multi-buffer files.
var stagedFiles = map[string]string{
	"criu/pages-1.img":    strings.Repeat("page", 3<<20), // 12 MiB: several hash buffers
	"criu/pagemap-1.img":  "pagemap",
	"criu/inventory.img":  "inventory",
	"criu/sub/nested.img": "nested",
	"logs/dump.log":       "log line\n",
	"criu/empty.img":      "",
}

func writeStaged(t *testing.T, s *Staging, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(s.Dir(), filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func testManifest() *Manifest {
	return &Manifest{
		GpucrVersion: "test",
		CRIUVersion:  "4.0",
		Created:      time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Host:         HostInfo{Hostname: "h", Kernel: "6.8", Arch: "amd64"},
		RootPID:      42,
		Processes:    []Process{{PID: 42, PPID: 1, Command: "python", Threads: 3}},
		MemoryBytes:  123,
		Phases:       []Phase{{Name: "dump", Duration: time.Second}},
	}
}

// commitImage commits stagedFiles into parent/img and returns the image directory.
func commitImage(t *testing.T) string {
	t.Helper()
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	if err := s.Commit(testManifest()); err != nil {
		t.Fatal(err)
	}
	return final
}

// entries lists the names in dir.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestCommitThenOpen(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(final); !os.IsNotExist(err) {
		t.Fatalf("final exists before Commit: %v", err)
	}
	for _, d := range []string{s.CRIUDir(), s.LogsDir()} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Fatalf("staging subdirectory %s: %v", d, err)
		}
	}
	writeStaged(t, s, stagedFiles)
	m := testManifest()
	if err := s.Commit(m); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, filepath.Dir(final)); !reflect.DeepEqual(got, []string{"img"}) {
		t.Fatalf("parent holds %v after Commit, want only img", got)
	}
	if err := s.Abort(); err != nil {
		t.Fatalf("Abort after Commit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(final, ManifestName)); err != nil {
		t.Fatalf("Abort after Commit touched the image: %v", err)
	}

	if m.FormatVersion != FormatVersion {
		t.Errorf("FormatVersion = %d, want %d", m.FormatVersion, FormatVersion)
	}
	if want := len(stagedFiles) - 1; len(m.Files) != want { // all but logs/dump.log
		t.Fatalf("manifest lists %d files, want %d: %v", len(m.Files), want, m.Files)
	}
	for i, f := range m.Files {
		if i > 0 && m.Files[i-1].Path >= f.Path {
			t.Errorf("files not sorted: %s before %s", m.Files[i-1].Path, f.Path)
		}
		content, ok := stagedFiles[f.Path]
		if !ok {
			t.Errorf("unexpected file %s", f.Path)
			continue
		}
		want := fmt.Sprintf("%016x", chunkedSum(content))
		if f.Size != int64(len(content)) || f.XXH64 != want {
			t.Errorf("%s: size %d xxh64 %s, want %d %s", f.Path, f.Size, f.XXH64, len(content), want)
		}
	}

	got, err := Open(final)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Errorf("manifest does not round-trip:\n got %+v\nwant %+v", got, m)
	}
}

func TestCommitIntoEmptyDir(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	if err := os.Mkdir(final, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	if err := s.Commit(testManifest()); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(final); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, filepath.Dir(final)); !reflect.DeepEqual(got, []string{"img"}) {
		t.Fatalf("parent holds %v after Commit, want only img", got)
	}
}

// A directory filled between Begin and Commit is not overwritten.
func TestCommitRefusesDirFilledMeanwhile(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	if err := os.MkdirAll(filepath.Join(final, "theirs"), 0o755); err != nil {
		t.Fatal(err)
	}
	err = s.Commit(testManifest())
	if !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("Commit = %v, want ErrNotEmpty", err)
	}
	if got := entries(t, final); !reflect.DeepEqual(got, []string{"theirs"}) {
		t.Fatalf("final holds %v, want its own content untouched", got)
	}
	if err := s.Abort(); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, filepath.Dir(final)); !reflect.DeepEqual(got, []string{"img"}) {
		t.Fatalf("parent holds %v after Abort", got)
	}
}

func TestCommitRefusesSymlink(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	defer abort(t, s)
	writeStaged(t, s, stagedFiles)
	if err := os.Symlink("/etc/passwd", filepath.Join(s.CRIUDir(), "link.img")); err != nil {
		t.Fatal(err)
	}
	err = s.Commit(testManifest())
	if err == nil || !strings.Contains(err.Error(), "criu/link.img is not a regular file") {
		t.Fatalf("Commit = %v, want an error naming criu/link.img", err)
	}
	if _, err := os.Stat(final); !os.IsNotExist(err) {
		t.Fatalf("a failed Commit created %s: %v", final, err)
	}
}

func TestAbort(t *testing.T) {
	parent := t.TempDir()
	s, err := Begin(filepath.Join(parent, "img"))
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	for i := range 2 {
		if err := s.Abort(); err != nil {
			t.Fatalf("Abort #%d: %v", i+1, err)
		}
	}
	if got := entries(t, parent); len(got) != 0 {
		t.Fatalf("parent holds %v after Abort, want nothing", got)
	}
}

func TestBeginRejects(t *testing.T) {
	tmp := t.TempDir()
	nonEmpty := filepath.Join(tmp, "full")
	file := filepath.Join(tmp, "file")
	if err := os.MkdirAll(filepath.Join(nonEmpty, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, final string
		sentinel    error
		msg         string
	}{
		{"non-empty dir", nonEmpty, ErrNotEmpty, "image directory " + nonEmpty + " is not empty: give a new or empty directory"},
		{"final is a file", file, nil, "is not a directory"},
		{"parent missing", filepath.Join(tmp, "no", "img"), ErrParentMissing, filepath.Join(tmp, "no") + " of image directory"},
		{"parent is a file", filepath.Join(file, "img"), nil, "parent " + file + " is not a directory"},
		{"parent not writable", "/proc/gpucr-test", nil, "image directory /proc/gpucr-test is not writable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Begin(tt.final)
			if err == nil {
				t.Fatalf("Begin succeeded (abort: %v)", s.Abort())
			}
			if tt.sentinel != nil && !errors.Is(err, tt.sentinel) {
				t.Errorf("error %v is not %v", err, tt.sentinel)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
	if got := entries(t, tmp); !reflect.DeepEqual(got, []string{"file", "full"}) {
		t.Fatalf("failed Begins left %v", got)
	}
}

func TestVerifyDetectsDamage(t *testing.T) {
	const victim = "criu/pages-1.img"
	tests := []struct {
		name   string
		damage func(path string) error
		reason string
	}{
		{"truncated", func(p string) error { return os.Truncate(p, 100) }, "size 100, want"},
		{"flipped byte", func(p string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			b := make([]byte, 1)
			const at = 7 << 20 // past the first hash buffer
			if _, err := f.ReadAt(b, at); err != nil {
				return err
			}
			b[0] ^= 0x01
			_, err = f.WriteAt(b, at)
			return err
		}, "checksum mismatch (want "},
		{"missing", os.Remove, "missing"},
		{"replaced by a symlink", func(p string) error {
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink("/etc/passwd", p)
		}, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := commitImage(t)
			if err := tt.damage(filepath.Join(dir, filepath.FromSlash(victim))); err != nil {
				t.Fatal(err)
			}
			_, err := Open(dir)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, want ErrCorrupt", err)
			}
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != victim {
				t.Fatalf("Open = %v, want a CorruptError for %s", err, victim)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "image file "+victim+": ") || !strings.Contains(msg, tt.reason) {
				t.Errorf("message %q does not name %s and %q", msg, victim, tt.reason)
			}
		})
	}
}

// Verify reports the first damaged file in path order, however the manifest is ordered.
func TestVerifyReportsFirstInPathOrder(t *testing.T) {
	dir := commitImage(t)
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"criu/sub/nested.img", "criu/pagemap-1.img"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(strings.Repeat("X", len(stagedFiles[p]))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for i, j := 0, len(m.Files)-1; i < j; i, j = i+1, j-1 {
		m.Files[i], m.Files[j] = m.Files[j], m.Files[i]
	}
	var ce *CorruptError
	if err := Verify(dir, m); !errors.As(err, &ce) || ce.Path != "criu/pagemap-1.img" {
		t.Fatalf("Verify = %v, want criu/pagemap-1.img", err)
	}
}

func TestLoadRejects(t *testing.T) {
	tests := []struct {
		name     string
		edit     func(m map[string]any) // nil: manifest removed
		raw      string                 // replaces the manifest when set
		sentinel error
		msg      string
	}{
		{name: "missing manifest", sentinel: ErrNoManifest, msg: "is not a gpucr image: no manifest.json"},
		{name: "invalid JSON", raw: "{not json", sentinel: ErrCorrupt, msg: "image file manifest.json: invalid JSON"},
		{name: "newer format", edit: func(m map[string]any) { m["formatVersion"] = FormatVersion + 1; m["files"] = "changed shape" },
			sentinel: ErrNewerFormat, msg: fmt.Sprintf("image format %d is newer than this gpucr supports (%d); upgrade gpucr", FormatVersion+1, FormatVersion)},
		{name: "no format version", edit: func(m map[string]any) { delete(m, "formatVersion") },
			sentinel: ErrCorrupt, msg: "image file manifest.json: no format version"},
		{name: "no files", edit: func(m map[string]any) { m["files"] = []any{} },
			sentinel: ErrCorrupt, msg: "image file manifest.json: no files listed"},
		{name: "path escapes", edit: func(m map[string]any) { setPath(m, "criu/../../outside") },
			sentinel: ErrCorrupt, msg: `image file manifest.json: file path "criu/../../outside" is not inside the image`},
		{name: "absolute path", edit: func(m map[string]any) { setPath(m, "/etc/passwd") },
			sentinel: ErrCorrupt, msg: `file path "/etc/passwd" is not inside the image`},
		{name: "unclean path", edit: func(m map[string]any) { setPath(m, "criu/./pages-1.img") },
			sentinel: ErrCorrupt, msg: `file path "criu/./pages-1.img" is not inside the image`},
		// Sign replaces or removes these, and then the image no longer verified; a pull and
		// fold take them as they take a manifest's own files and logs, not as listed ones.
		{name: "signature listed", edit: func(m map[string]any) { setPath(m, SigName) },
			sentinel: ErrCorrupt, msg: "file manifest.sig is listed, but a manifest never lists"},
		{name: "interrupted sign's file listed", edit: func(m map[string]any) { setPath(m, ManifestName+".new") },
			sentinel: ErrCorrupt, msg: "file manifest.json.new is listed"},
		{name: "log listed", edit: func(m map[string]any) { setPath(m, LogsDir+"/dump.log") },
			sentinel: ErrCorrupt, msg: "file logs/dump.log is listed"},
		{name: "edited, seal not", raw: "-", sentinel: ErrCorrupt, msg: "image file manifest.json: does not match manifest.sha256"},
		{name: "seal missing", raw: "no seal", sentinel: ErrCorrupt, msg: "image file manifest.sha256: missing"},
		{name: "bad checksum field", edit: func(m map[string]any) { m["files"].([]any)[0].(map[string]any)["xxh64"] = "zz" },
			sentinel: ErrCorrupt, msg: "has an invalid size or checksum"},
		// A sparse file of 2^62 bytes made verify and restore die allocating its pieces.
		{name: "size beyond any image", edit: func(m map[string]any) { m["files"].([]any)[0].(map[string]any)["size"] = int64(1) << 62 },
			sentinel: ErrCorrupt, msg: "more than any image gpucr writes"},
		// PIDs a rollback would signal and a fill would write into: only the tree's own.
		{name: "PID 0", edit: func(m map[string]any) { procs(m)[0]["pid"] = 0; m["rootPid"] = 0 },
			sentinel: ErrCorrupt, msg: "no root PID"},
		{name: "PID -1", edit: func(m map[string]any) { m["processes"] = append(m["processes"].([]any), map[string]any{"pid": -1}) },
			sentinel: ErrCorrupt, msg: "process PID -1 is not a PID"},
		{name: "PID beyond the kernel's", edit: func(m map[string]any) {
			m["processes"] = append(m["processes"].([]any), map[string]any{"pid": 1 << 23})
		},
			sentinel: ErrCorrupt, msg: "process PID 8388608 is not a PID"},
		// A restore takes a lock, and a descriptor, for each: 100,000 ran it out of them.
		{name: "too many processes", edit: func(m map[string]any) {
			for pid := 1000; pid < 1000+MaxProcesses; pid++ {
				m["processes"] = append(m["processes"].([]any), map[string]any{"pid": pid})
			}
		}, sentinel: ErrCorrupt, msg: "more than the 32768 of any tree gpucr checkpoints"},
		{name: "PID twice", edit: func(m map[string]any) { m["processes"] = append(m["processes"].([]any), map[string]any{"pid": 42}) },
			sentinel: ErrCorrupt, msg: "process 42 is listed twice"},
		{name: "root not in tree", edit: func(m map[string]any) { m["rootPid"] = 7 },
			sentinel: ErrCorrupt, msg: "root PID 7 is not among the image's processes"},
		{name: "GPU process not in tree", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia", "processes": []any{map[string]any{"pid": 1}}}}
		}, sentinel: ErrCorrupt, msg: "GPU process 1 is not among the image's processes"},
		{name: "device file holder not in tree", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia", "deviceFileHolders": []any{1}}}
		}, sentinel: ErrCorrupt, msg: "process 1 holding nvidia device files is not among the image's processes"},
		{name: "device file holder PID 0", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia", "deviceFileHolders": []any{0}}}
		}, sentinel: ErrCorrupt, msg: "process 0 holding nvidia device files is not among the image's processes"},
		// A restore planned each backend from its first snapshot: the process of a second
		// came back with its GPU state left checkpointed, and the restore said it succeeded.
		{name: "GPU backend twice", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia"},
				map[string]any{"backend": "nvidia", "processes": []any{map[string]any{"pid": 42}}}}
		}, sentinel: ErrCorrupt, msg: `GPU backend "nvidia" is listed twice`},
		// Two driver restores ran on it at once, the second failing after CRIU's restore.
		{name: "GPU process twice", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia", "processes": []any{map[string]any{"pid": 42}, map[string]any{"pid": 42}}}}
		}, sentinel: ErrCorrupt, msg: "GPU process 42 is listed twice"},
		// One of the two was lost to the mapping, or compared with the other as its host GPU.
		{name: "GPU UUID twice", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia", "devices": []any{
				map[string]any{"index": 0, "uuid": "GPU-a"}, map[string]any{"index": 1, "uuid": "GPU-a"}}}}
		}, sentinel: ErrCorrupt, msg: `GPU "GPU-a" is listed twice`},
		{name: "GPU index twice", edit: func(m map[string]any) {
			m["gpus"] = []any{map[string]any{"backend": "nvidia", "devices": []any{
				map[string]any{"index": 0, "uuid": "GPU-a"}, map[string]any{"index": 0, "uuid": "GPU-b"}}}}
		}, sentinel: ErrCorrupt, msg: "two GPUs have index 0"},
		// A restore creates the linked files, as root, in /dev/shm: only semaphores' names
		// there, CRIU's links beside them, few bytes.
		{name: "linked file outside /dev/shm", edit: linked("/etc/sem.x", "link_remap.3", ""),
			sentinel: ErrCorrupt, msg: `linked file "/etc/sem.x" is not a semaphore's file in /dev/shm`},
		{name: "linked file up and out", edit: linked("/dev/shm/sem./../../etc/passwd", "link_remap.3", ""),
			sentinel: ErrCorrupt, msg: "is not a semaphore's file in /dev/shm"},
		{name: "linked file not a semaphore", edit: linked("/dev/shm/other", "link_remap.3", ""),
			sentinel: ErrCorrupt, msg: "is not a semaphore's file in /dev/shm"},
		{name: "linked file's link elsewhere", edit: linked("/dev/shm/sem.x", "../link_remap.3", ""),
			sentinel: ErrCorrupt, msg: `linked file /dev/shm/sem.x has an invalid link name "../link_remap.3"`},
		{name: "linked file's link not CRIU's", edit: linked("/dev/shm/sem.x", "sem.y", ""),
			sentinel: ErrCorrupt, msg: "has an invalid link name"},
		{name: "linked file too large", edit: linked("/dev/shm/sem.x", "link_remap.3", strings.Repeat("A", 8192)),
			sentinel: ErrCorrupt, msg: "linked file /dev/shm/sem.x holds 6144 bytes, more than 4096"},
		{name: "linked file setuid", edit: func(m map[string]any) {
			linked("/dev/shm/sem.x", "link_remap.3", "")(m)
			m["linkedFiles"].([]any)[0].(map[string]any)["mode"] = 0o4755
		}, sentinel: ErrCorrupt, msg: "linked file /dev/shm/sem.x has an invalid mode 4755"},
		{name: "linked file twice", edit: func(m map[string]any) {
			linked("/dev/shm/sem.x", "link_remap.3", "")(m)
			linked("/dev/shm/sem.y", "link_remap.3", "")(m)
		}, sentinel: ErrCorrupt, msg: "linked file /dev/shm/sem.y or its link link_remap.3 is listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := commitImage(t)
			mpath := filepath.Join(dir, ManifestName)
			switch {
			case tt.raw == "-":
				testutil.EditJSON(t, mpath, func(m map[string]any) { m["rootPid"] = 2 })
			case tt.raw == "no seal":
				if err := os.Remove(filepath.Join(dir, SealName)); err != nil {
					t.Fatal(err)
				}
			case tt.raw != "":
				if err := os.WriteFile(mpath, []byte(tt.raw), 0o600); err != nil {
					t.Fatal(err)
				}
			case tt.edit != nil:
				editManifest(t, mpath, tt.edit)
			default:
				if err := os.Remove(mpath); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Open(dir)
			if !errors.Is(err, tt.sentinel) {
				t.Fatalf("Open = %v, want %v", err, tt.sentinel)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("message %q does not contain %q", err, tt.msg)
			}
		})
	}
}

// A crash after the manifest is written but before the rename leaves a staging directory
// with a manifest; it must never be taken for an image.
func TestLoadRefusesStagingDir(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	defer abort(t, s)
	if base := filepath.Base(s.Dir()); !strings.HasPrefix(base, ".img.partial-") {
		t.Fatalf("staging directory %s is not hidden beside img", s.Dir())
	}
	writeStaged(t, s, stagedFiles)
	b, err := json.Marshal(&Manifest{FormatVersion: FormatVersion, RootPID: 1,
		Files: []File{{Path: "logs/dump.log", Size: 9, XXH64: fmt.Sprintf("%016x", chunkedSum("log line\n"))}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(s.Dir()); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("Open(staging) = %v, want ErrNoManifest", err)
	}
	if _, err := os.Stat(final); !os.IsNotExist(err) {
		t.Fatalf("%s exists before Commit: %v", final, err)
	}
}

func procs(m map[string]any) []map[string]any {
	var out []map[string]any
	for _, p := range m["processes"].([]any) {
		out = append(out, p.(map[string]any))
	}
	return out
}

func setPath(m map[string]any, p string) {
	m["files"].([]any)[0].(map[string]any)["path"] = p
}

// editManifest changes the manifest and seals it again, as a deliberate edit would, so that
// what is tested is the check of the content behind the seal.
func editManifest(t *testing.T, path string, edit func(map[string]any)) {
	t.Helper()
	testutil.EditJSON(t, path, edit)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), SealName), []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// chunkedSum computes a checksum the way HashChunkSize documents it, independently of hash.go.
func chunkedSum(content string) uint64 {
	var digests []byte
	for off := 0; off < len(content); off += HashChunkSize {
		d := xxhash.Sum64String(content[off:min(off+HashChunkSize, len(content))])
		digests = binary.LittleEndian.AppendUint64(digests, d)
	}
	return xxhash.Sum64(digests)
}

// An image holds what its manifest lists and nothing else: an extra file (memory for
// another process, say) or a symlink out of the image is refused before anything reads it.
func TestOpenRefusesWhatIsNotListed(t *testing.T) {
	for name, add := range map[string]func(dir string) error{
		"extra file": func(dir string) error {
			if err := os.MkdirAll(filepath.Join(dir, "mem"), 0o700); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "mem", "1-1000.img"), []byte("x"), 0o600)
		},
		"symlink": func(dir string) error { return os.Symlink("/etc/shadow", filepath.Join(dir, "criu", "shadow")) },
		"listed file swapped for a symlink": func(dir string) error {
			p := filepath.Join(dir, "criu", "pages-1.img")
			if err := os.Rename(p, p+".orig"); err != nil {
				return err
			}
			return os.Symlink("pages-1.img.orig", p)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := commitImage(t)
			if err := add(dir); err != nil {
				t.Fatal(err)
			}
			if _, err := Open(dir); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open = %v, want ErrCorrupt", err)
			}
		})
	}
	// Reading a listed file never follows a symlink on its way, whatever the listing says.
	dir := commitImage(t)
	if err := os.Rename(filepath.Join(dir, "criu"), filepath.Join(dir, "criu.real")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("criu.real", filepath.Join(dir, "criu")); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSums(dir, m.Files); err == nil {
		t.Fatal("CheckSums read files through a symlinked directory")
	}
}

// Every file of an image is 0600 and every directory 0700, whoever wrote them and how:
// CRIU writes its own files (ghost files, pipe data) 0644.
func TestCommitLocksModesDown(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	if err := os.Chmod(filepath.Join(s.Dir(), "criu", "pages-1.img"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(s.Dir(), "criu", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(testManifest()); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(final, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Phases are written in seconds (format 2); a format 1 manifest's nanoseconds still read.
func TestPhaseJSON(t *testing.T) {
	b, err := json.Marshal(Phase{Name: "criu-dump", Duration: 1500 * time.Millisecond})
	if err != nil || string(b) != `{"name":"criu-dump","seconds":1.5}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	for _, in := range []string{`{"name":"criu-dump","seconds":1.5}`, `{"name":"criu-dump","durationNs":1500000000}`} {
		var p Phase
		if err := json.Unmarshal([]byte(in), &p); err != nil || p != (Phase{Name: "criu-dump", Duration: 1500 * time.Millisecond}) {
			t.Errorf("Unmarshal(%s) = %+v, %v", in, p, err)
		}
	}
}

// abort removes a staging directory at the end of a test; a leftover fails the test.
func abort(t *testing.T, s *Staging) {
	t.Helper()
	if err := s.Abort(); err != nil {
		t.Error(err)
	}
}

// A symlink or a mount point cannot take the finished image's rename: refused up front,
// before any checkpoint pauses a workload for it.
func TestBeginRefusesSymlinksAndMountPoints(t *testing.T) {
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if _, err := Begin(link); !errors.Is(err, ErrNotAPlace) {
		t.Errorf("Begin on a symlink to an empty directory = %v, want ErrNotAPlace", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, 0) })
	if _, err := Begin(mnt); !errors.Is(err, ErrNotAPlace) {
		t.Errorf("Begin on a mount point = %v, want ErrNotAPlace", err)
	}
}

// A staging directory renamed into place by a commit is known as committed from its path
// alone: gpucr killed between the rename and its journal's word of it was reported as a
// checkpoint rolled back, its image complete all the same (found by a hostile test).
func TestCommittedFromItsStagingPath(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	staging := StagingPath(final, "checkpoint-1a2b")
	s, err := BeginAt(final, staging)
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	if _, ok := CommittedFrom(staging); ok {
		t.Fatal("a staged image counts as committed")
	}
	if err := s.Commit(testManifest()); err != nil {
		t.Fatal(err)
	}
	if got, ok := CommittedFrom(staging); !ok || got != final {
		t.Fatalf("CommittedFrom after the commit = %q, %v; want %q", got, ok, final)
	}
	if err := os.Remove(filepath.Join(final, ManifestName)); err != nil {
		t.Fatal(err)
	}
	if _, ok := CommittedFrom(staging); ok {
		t.Fatal("a directory without a manifest counts as a committed image")
	}
	if _, ok := CommittedFrom(filepath.Join(t.TempDir(), "plain")); ok {
		t.Fatal("a path that is no staging path counts as committed")
	}
}

// An image is not made, as root, in a directory another user can change, nor below one:
// that user could swap the staging directory root writes by name and have root truncate a
// file of theirs, or read the dumped memory (a hostile test). A root-owned sticky directory
// (as /tmp) is fine: there nobody renames what root owns.
func TestBeginRefusesAParentOthersCanChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	root := t.TempDir()
	for name, mode := range map[string]os.FileMode{"world-writable": 0o777, "group-writable": 0o770} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		for _, final := range []string{filepath.Join(dir, "img"), filepath.Join(dir, "sub", "img")} {
			if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
				t.Fatal(err)
			}
			if s, err := Begin(final); err == nil || !strings.Contains(err.Error(), "only root can change") {
				if s != nil {
					_ = s.Abort()
				}
				t.Errorf("Begin(%s) in a %s directory: %v", final, name, err)
			}
		}
	}
	owned := filepath.Join(root, "users")
	if err := os.Mkdir(owned, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(owned, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Begin(filepath.Join(owned, "img")); err == nil {
		t.Error("Begin in a directory another user owns")
	}
	sticky := filepath.Join(root, "sticky")
	if err := os.Mkdir(sticky, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	s, err := Begin(filepath.Join(sticky, "img"))
	if err != nil {
		t.Fatalf("Begin in a root-owned sticky directory: %v", err)
	}
	if err := s.Abort(); err != nil {
		t.Fatal(err)
	}

	// A user's symlink to a directory only root can change is the user's to point elsewhere
	// while root writes through it (a hostile test did, mid-checkpoint): refused, in the
	// user's directory or in a sticky one, as is root's own symlink in the user's directory.
	safe := filepath.Join(root, "safe")
	if err := os.Mkdir(safe, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		at  string
		uid int
	}{{filepath.Join(owned, "ckpts"), 65534}, {filepath.Join(sticky, "ckpts"), 65534}, {filepath.Join(owned, "mine"), 0}} {
		if err := os.Symlink(safe, l.at); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(l.at, l.uid, l.uid); err != nil {
			t.Fatal(err)
		}
		if s, err := Begin(filepath.Join(l.at, "img")); err == nil || !strings.Contains(err.Error(), "only root can change") {
			if s != nil {
				_ = s.Abort()
			}
			t.Errorf("Begin through %s (a symlink of uid %d to %s): %v", l.at, l.uid, safe, err)
		}
	}
}

// A new image put inside an image adds files its manifest does not list: fold, checkpoint
// -D and pull into one said they succeeded, and the image no longer verified (hostile
// test). Refused up front; a directory that merely has a file named manifest.json is no
// image.
func TestBeginRefusesAPlaceInsideAnImage(t *testing.T) {
	img := commitImage(t)
	for _, inside := range []string{filepath.Join(img, "criu", "new"), filepath.Join(img, "logs", "new")} {
		if _, err := Begin(inside); !errors.Is(err, ErrNotAPlace) || !strings.Contains(err.Error(), img) {
			t.Errorf("Begin(%s) = %v, want ErrNotAPlace naming the image", inside, err)
		}
	}
	if _, err := Load(img); err != nil {
		t.Fatalf("the image after the refusals: %v", err)
	}
	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, ManifestName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Begin(filepath.Join(project, "ckpt"))
	if err != nil {
		t.Fatalf("Begin beside a manifest.json that is no image: %v", err)
	}
	abort(t, s)
}

// linked adds to a manifest a linked file of path, its link remap, and its data in base64
// as JSON has bytes.
func linked(path, remap, data string) func(m map[string]any) {
	return func(m map[string]any) {
		files, _ := m["linkedFiles"].([]any)
		m["linkedFiles"] = append(files, map[string]any{"path": path, "remap": remap, "mode": 0o600, "data": data})
	}
}

// An image's linked files load as written; one without any (older) loads as before.
func TestLoadKeepsLinkedFiles(t *testing.T) {
	dir := commitImage(t)
	editManifest(t, filepath.Join(dir, ManifestName), linked("/dev/shm/sem.mp-1_x", "link_remap.12", "AAECAw=="))
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []LinkedFile{{Path: "/dev/shm/sem.mp-1_x", Remap: "link_remap.12", Mode: 0o600, Data: []byte{0, 1, 2, 3}}}
	if !reflect.DeepEqual(m.LinkedFiles, want) {
		t.Fatalf("LinkedFiles = %+v, want %+v", m.LinkedFiles, want)
	}
}
