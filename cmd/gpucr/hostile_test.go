package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/image/imagetest"
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
			if code == 0 || !strings.Contains(out, tc.want) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
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
