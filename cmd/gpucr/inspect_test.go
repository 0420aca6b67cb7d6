package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/archive"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
)

// Text an image carries reaches the terminal without its control characters: a hostname
// crafted to set the terminal's title (an OSC sequence) prints as harmless text.
func TestInspectPrintsNoControlCharacters(t *testing.T) {
	m := &image.Manifest{FormatVersion: 1, Host: image.HostInfo{Hostname: "h\x1b]0;pwned\x07", Kernel: "6.1\x9b2J"}}
	criu := &criuimg.Summary{Processes: []criuimg.Process{{PID: 42, PPID: 1, Command: "counter\x1b[2J", Threads: 1}}}
	var b bytes.Buffer
	printInspect(terminalSafe{&b}, inspectOutput{Dir: "/img", Manifest: m, CRIU: criu}, false)
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07\u009b") {
		t.Fatalf("inspect printed control characters: %q", out)
	}
	if !strings.Contains(out, "h?]0;pwned?") || !strings.Contains(out, "counter?[2J") {
		t.Errorf("the crafted text is not shown: %q", out)
	}
}

// Nor does that text start lines of its own: a newline in a hostname, a command or an
// archive's container name would print a line the image's author chose, such as one that
// says the image is signed.
func TestInspectPrintsNoLineOfTheImages(t *testing.T) {
	const forged = "\nsigned by trusted key 0123456789abcdef"
	m := &image.Manifest{FormatVersion: 1, Host: image.HostInfo{Hostname: "h" + forged}}
	criu := &criuimg.Summary{Processes: []criuimg.Process{{PID: 42, PPID: 1, Command: "counter" + forged + "\n", Threads: 1}}}
	a := &archiveInspect{Layout: "podman", Config: &archive.Config{ID: "c1", Name: "n" + forged, Runtime: "runc" + forged + "\n"}}
	var b bytes.Buffer
	printInspect(terminalSafe{&b}, inspectOutput{Dir: "/img", Manifest: m, CRIU: criu, Archive: a}, false)
	for line := range strings.Lines(b.String()) {
		if strings.HasPrefix(strings.TrimSpace(line), "signed by") {
			t.Fatalf("the image printed a line of its own: %q in\n%s", line, b.String())
		}
	}
	if n := strings.Count(b.String(), "?signed by"); n != 4 {
		t.Errorf("the crafted text is shown %d times, want 4:\n%s", n, b.String())
	}
}

// The processes holding device files without GPU state are shown, as --json shows them:
// an image of a DataLoader worker and its parent printed the parent alone.
func TestInspectShowsDeviceFileHolders(t *testing.T) {
	m := &image.Manifest{FormatVersion: 1, GPUs: []gpu.Snapshot{{
		Host:        gpu.Host{Backend: "nvidia", DriverVersion: "580"},
		Processes:   []gpu.Process{{PID: 42, MemoryBytes: 1 << 30, Devices: []string{"GPU-0"}}},
		FileHolders: []int{43},
	}}}
	criu := &criuimg.Summary{Processes: []criuimg.Process{{PID: 42, PPID: 1, Command: "python", Threads: 1}, {PID: 43, PPID: 42, Command: "python", Threads: 1}}}
	var b bytes.Buffer
	printInspect(terminalSafe{&b}, inspectOutput{Dir: "/img", Manifest: m, CRIU: criu}, false)
	if !strings.Contains(b.String(), "pid 43: nvidia device files without GPU state") {
		t.Fatalf("the process holding device files is not shown:\n%s", b.String())
	}
}

// A runc checkpoint directory's descriptors.json is read as container.json is, a small
// regular file beneath the directory or nothing: a symlink to /dev/zero made inspect fill
// its memory, a FIFO made it wait for good (hostile test).
func TestInspectReadsRuncDescriptorsBeneathTheDirectory(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(outside, []byte(`["/dev/null"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		plant func(path string) error
	}{
		{"symlink", func(path string) error { return os.Symlink(outside, path) }},
		{"FIFO", func(path string) error { return syscall.Mkfifo(path, 0o600) }},
		{"file too large", func(path string) error { return os.WriteFile(path, make([]byte, maxRuncDescriptors+1), 0o600) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "pstree.img"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, runcDescriptors)
			if err := c.plant(path); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, _, err := loadInspect(dir)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "\n") {
					t.Errorf("inspect of a %s as %s: %v, want one line naming it", c.name, runcDescriptors, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("inspect of a %s as %s waits", c.name, runcDescriptors)
			}
		})
	}
}
