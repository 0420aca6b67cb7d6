package image

import (
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/gpu"
)

// Seal modes of FuzzLoad: how the seal beside the manifest relates to it.
const (
	sealRight = iota
	sealMissing
	sealWrong
	sealModes
)

// encodeManifest is the manifest as Seal writes it.
func encodeManifest(t testing.TB, m *Manifest) []byte {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// writeManifest puts b into dir as the manifest, and the seal mode says what seal with it.
func writeManifest(t testing.TB, dir string, b []byte, mode uint8) {
	if err := os.WriteFile(filepath.Join(dir, ManifestName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	sealPath := filepath.Join(dir, SealName)
	switch mode % sealModes {
	case sealRight:
		err := os.WriteFile(sealPath, []byte(seal(b)+"\n"), 0o600)
		if err != nil {
			t.Fatal(err)
		}
	case sealMissing:
		if err := os.Remove(sealPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	case sealWrong:
		if err := os.WriteFile(sealPath, []byte(seal(append(b, ' '))+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// The manifest is the first thing a restore reads from an image anyone may have written.
// Load refuses it as corrupt or as a newer format, or returns a manifest whose PIDs and
// file paths a restore can use as they are: positive PIDs of one tree, listed once, clean
// paths inside the image, sizes and checksums well formed. What it accepts, sealed again,
// loads again to the same manifest; and nothing loads without its seal.
func FuzzLoad(f *testing.F) {
	// A manifest as a checkpoint commits it.
	final := filepath.Join(f.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		f.Fatal(err)
	}
	for p, content := range map[string]string{"criu/pages-1.img": "pages", "criu/empty.img": "", "logs/dump.log": "log\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(s.Dir(), p)), 0o700); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(s.Dir(), p), []byte(content), 0o600); err != nil {
			f.Fatal(err)
		}
	}
	if err := s.Commit(testManifest()); err != nil {
		f.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(final, ManifestName))
	if err != nil {
		f.Fatal(err)
	}
	if _, err := Load(final); err != nil {
		f.Fatalf("a committed image: %v", err)
	}
	f.Add(committed, uint8(sealRight))
	f.Add(committed, uint8(sealMissing))
	f.Add(committed, uint8(sealWrong))

	withGPUs := testManifest()
	withGPUs.FormatVersion = FormatVersion
	withGPUs.Processes = append(withGPUs.Processes, Process{PID: 43, PPID: 42, Command: "worker", Threads: 1})
	withGPUs.GPUs = []gpu.Snapshot{{Host: gpu.Host{Backend: "nvidia", DriverVersion: "580.65.06",
		Devices: []gpu.Device{{Index: 0, UUID: "GPU-a", Name: "NVIDIA H100", NUMANode: -1, Properties: gpu.Properties{"computeCapability": "9.0"}}}},
		Processes: []gpu.Process{{PID: 43, Devices: []string{"GPU-a"}, MemoryBytes: 1 << 30}}}}
	withGPUs.Files = []File{{Path: "criu/pages-1.img", Size: 5, XXH64: "0123456789abcdef"}, {Path: "mem/43-7f0000000000.img", Size: 1 << 24, XXH64: "fedcba9876543210"}}
	f.Add(encodeManifest(f, withGPUs), uint8(sealRight))
	for _, edit := range []func(m *Manifest){
		func(m *Manifest) { m.Files[0].Path = "criu/../../etc/passwd" },
		func(m *Manifest) { m.Files[0].Path = "." },
		func(m *Manifest) { m.Files[1].Path = m.Files[0].Path },
		func(m *Manifest) { m.Files[0].Size = -1 },
		func(m *Manifest) { m.Files[0].XXH64 = "0123456789ABCDEF" },
		func(m *Manifest) { m.RootPID = 7 },
		func(m *Manifest) { m.Processes[1].PID = -43 },
		func(m *Manifest) { m.GPUs[0].Processes[0].PID = 44 },
		func(m *Manifest) { m.FormatVersion = FormatVersion + 1 },
	} {
		m := new(Manifest)
		*m = *withGPUs
		m.Files = slices.Clone(withGPUs.Files)
		m.Processes = slices.Clone(withGPUs.Processes)
		m.GPUs = []gpu.Snapshot{withGPUs.GPUs[0]}
		m.GPUs[0].Processes = slices.Clone(withGPUs.GPUs[0].Processes)
		edit(m)
		f.Add(encodeManifest(f, m), uint8(sealRight))
	}
	f.Add([]byte(`{"formatVersion":1,"rootPid":1,"processes":[{"pid":1}],"files":[{"path":"a","size":0,"xxh64":"0000000000000000"}]}`), uint8(sealRight))
	f.Add([]byte(`{"formatVersion":2,"files":"a newer shape"}`), uint8(sealMissing))
	f.Add([]byte(`{"formatVersion":1e400}`), uint8(sealRight))
	f.Add([]byte(`null`), uint8(sealRight))
	f.Add([]byte(``), uint8(sealRight))

	dir := filepath.Join(f.TempDir(), "image")
	if err := os.Mkdir(dir, 0o700); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		writeManifest(t, dir, data, mode)
		var m *Manifest
		var err error
		if n := fuzzcheck.Allocated(func() { m, err = Load(dir) }); n > fuzzcheck.AllocSlack+uint64(256*len(data)) {
			t.Fatalf("Load allocated %d bytes for a %d-byte manifest", n, len(data))
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNewerFormat) {
				t.Fatalf("Load = %v: neither corrupt nor a newer format", err)
			}
			return
		}
		if mode%sealModes != sealRight {
			t.Fatalf("loaded a manifest with seal mode %d", mode%sealModes)
		}
		if m.FormatVersion < 1 || m.FormatVersion > FormatVersion || m.RootPID <= 0 || len(m.Files) == 0 {
			t.Fatalf("accepted format %d, root PID %d, %d files", m.FormatVersion, m.RootPID, len(m.Files))
		}
		pids := map[int]bool{}
		for _, p := range m.Processes {
			if p.PID <= 0 || pids[p.PID] {
				t.Fatalf("accepted process PID %d (listed before: %v)", p.PID, pids[p.PID])
			}
			pids[p.PID] = true
		}
		if !pids[m.RootPID] {
			t.Fatalf("accepted root PID %d outside the tree", m.RootPID)
		}
		for _, g := range m.GPUs {
			for _, p := range g.Processes {
				if !pids[p.PID] {
					t.Fatalf("accepted GPU process %d outside the tree", p.PID)
				}
			}
		}
		parents := map[int]bool{}
		for _, p := range m.Processes {
			parents[p.PPID] = true
		}
		for _, pid := range m.Leaves() {
			if !pids[pid] || parents[pid] {
				t.Fatalf("leaf %d: in the tree %v, a parent %v", pid, pids[pid], parents[pid])
			}
		}
		paths := map[string]bool{}
		for _, file := range m.Files {
			if !filepath.IsLocal(file.Path) || path.Clean(file.Path) != file.Path || paths[file.Path] {
				t.Fatalf("accepted file path %q (listed before: %v)", file.Path, paths[file.Path])
			}
			paths[file.Path] = true
			if file.Size < 0 || !IsXXH64(file.XXH64) {
				t.Fatalf("accepted file %+v", file)
			}
		}

		b := encodeManifest(t, m)
		writeManifest(t, dir, b, sealRight)
		again, err := Load(dir)
		if err != nil {
			t.Fatalf("an accepted manifest, sealed again, is refused: %v", err)
		}
		if b2 := encodeManifest(t, again); string(b) != string(b2) {
			t.Fatalf("an accepted manifest changes when loaded again:\n%s\n%s", b, b2)
		}
	})
}
