package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// Images changed after their checkpoint and sealed again, as whoever can write an image (an
// object store, another host) could: each is refused with one line and a non-zero exit
// before anything runs, and nothing outside the image is touched — here a bystander process
// whose memory a crafted image aims at.
func TestCraftedImagesAreRefused(t *testing.T) {
	needCRIU(t)
	good, w := sharedImage(t)
	bystander := startCounter(t, "-mib", "4")
	cases := []struct {
		name   string
		change func(t *testing.T, staged string)
		want   string
	}{
		{"memory for a process outside the tree", func(t *testing.T, staged string) {
			write(t, filepath.Join(staged, "mem", fmt.Sprintf("%d-%x.img", bystander.pid, 0x10000)), make([]byte, 4096))
		}, "not in the image's tree"},
		{"pages file shorter than its pagemap", func(t *testing.T, staged string) {
			p := largestPagesFile(t, staged)
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, fi.Size()-4096); err != nil {
				t.Fatal(err)
			}
		}, "damaged, or changed with its manifest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := imagetest.Recommit(t, good, func(staged string) { tc.change(t, staged) })
			mustGpucr(t, "verify", dir) // sealed again: the seal alone cannot tell
			out, code := gpucr(t, "restore", "-D", dir)
			if code == 0 || !oneLineWith(out, tc.want) {
				t.Fatalf("restore: exit %d, want one line naming %q:\n%s", code, tc.want, out)
			}
			if alive(w.pid) {
				t.Fatal("a process of the refused image runs")
			}
			bystander.checkRunsOn(t, tc.name)
			if v := bystander.verify(t, bystander.pid); v != "ok" {
				t.Fatalf("the bystander's memory: %s", v)
			}
		})
	}
	// Files the manifest does not list, or a symlink out of the image, are refused even
	// when the seal is left alone.
	for name, add := range map[string]func(dir string){
		"unlisted file": func(dir string) {
			write(t, filepath.Join(dir, "mem", strconv.Itoa(bystander.pid)+"-1000.img"), make([]byte, 4096))
		},
		"symlink to a host file": func(dir string) {
			if err := os.Symlink("/etc/shadow", filepath.Join(dir, "criu", "ghost.img")); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := copyImage(t, good)
			add(dir)
			out, code := gpucr(t, "restore", "-D", dir)
			if code == 0 || !strings.Contains(out, "image file") {
				t.Fatalf("restore: exit %d:\n%s", code, out)
			}
			if alive(w.pid) {
				t.Fatal("a process of the refused image runs")
			}
		})
	}
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A CRIU that hangs — before it creates the tasks, or with them restored but never resumed
// (here an action script that sleeps, read from CRIU's config file) — does not hang gpucr:
// SIGTERM ends the restore with one line, CRIU is killed, nothing of the restore is left
// running, the image is unchanged and restores once CRIU behaves.
func TestInterruptedRestoreOfAHungCRIU(t *testing.T) {
	needCRIU(t)
	dir, w := sharedImage(t)
	tmp := t.TempDir()
	script := filepath.Join(tmp, "hang.sh")
	write(t, script, []byte("#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = \"$HANG_AT\" ] || exit 0\necho $$ > \"$CRIU_PID.script\"\necho $PPID > \"$CRIU_PID\"\nexec sleep 1000\n"))
	if err := os.Chmod(script, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(tmp, "criu.conf")
	write(t, conf, []byte("action-script "+script+"\n"))
	for _, at := range []string{"pre-restore", "post-restore"} {
		t.Run(at, func(t *testing.T) {
			criuPID := filepath.Join(tmp, at+".pid")
			cmd := exec.Command(bin.gpucr, "restore", "-D", dir)
			cmd.Env = append(os.Environ(), "CRIU_CONFIG_FILE="+conf, "HANG_AT="+at, "CRIU_PID="+criuPID)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			criu := waitPIDFile(t, criuPID)
			t.Cleanup(func() { killAndReap(waitPIDFile(t, criuPID+".script")) })
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("gpucr did not end within 30 s of SIGTERM:\n%s", out.String())
			}
			if err == nil || !oneLineWith(out.String(), "CRIU was stopped") {
				t.Fatalf("restore: %v, want one line saying CRIU was stopped:\n%s", err, out.String())
			}
			if p, err := proctree.Read(criu); err == nil && !p.Zombie {
				t.Fatalf("CRIU %d still runs after the restore ended", criu)
			}
			if p, err := proctree.Read(w.pid); err == nil && !p.Zombie {
				t.Fatal("a restored process runs after the restore ended")
			}
			mustGpucr(t, "verify", dir)
		})
	}
	waitGone(t, w.pid)
	mustGpucr(t, "restore", "-D", dir)
	t.Cleanup(func() { killAndReap(w.pid) })
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after the restore: %s", v)
	}
}

// waitPIDFile waits for a PID written to path.
func waitPIDFile(t *testing.T, path string) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
	}
	t.Fatalf("nothing wrote a PID to %s", path)
	return 0
}

// A pushed checkpoint whose object manifest gained a file — here a zero-chunk memory file
// aimed at a bystander, the smallest addition a store's writer can make — is refused by pull
// and by restore --from, nothing is left at the destination and the bystander is untouched.
func TestTamperedStoreManifestIsRefused(t *testing.T) {
	needCRIU(t)
	good, w := sharedImage(t)
	bystander := startCounter(t, "-mib", "4")
	loc := filepath.Join(t.TempDir(), "store", "ckpt")
	mustGpucr(t, "push", good, loc)
	obj := filepath.Join(loc, chunked.ManifestObject)
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m chunked.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.Files = append(m.Files, chunked.File{Path: fmt.Sprintf("mem/%d-10000.img", bystander.pid), Size: 4096,
		Chunks: []chunked.Chunk{{Size: 4096, Zero: true}}})
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	write(t, obj, b)
	for name, args := range map[string][]string{
		"pull":           {"pull", loc, filepath.Join(t.TempDir(), "pulled")},
		"restore --from": {"restore", "--from", loc, "-D", filepath.Join(t.TempDir(), "pulled")},
	} {
		out, code := gpucr(t, args...)
		if code == 0 || !oneLineWith(out, "not listed in the manifest") {
			t.Fatalf("%s: exit %d, want one line naming the unlisted file:\n%s", name, code, out)
		}
		if dest := args[len(args)-1]; name == "pull" {
			if _, err := os.Stat(dest); !os.IsNotExist(err) {
				t.Fatalf("%s left %s: %v", name, dest, err)
			}
		}
		if alive(w.pid) {
			t.Fatalf("%s: a process of the refused image runs", name)
		}
	}
	bystander.checkRunsOn(t, "a tampered store manifest")
	if v := bystander.verify(t, bystander.pid); v != "ok" {
		t.Fatalf("the bystander's memory: %s", v)
	}
}
