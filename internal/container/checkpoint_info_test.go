package container

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// container.json is read beneath the image, regular and small: a symlink to /dev/zero made
// root's gpucr fill its memory, a FIFO made it wait for good (hostile test). A missing one
// is still told apart.
func TestReadInfoTakesOnlyASmallRegularFile(t *testing.T) {
	for name, plant := range map[string]func(path string) error{
		"a symlink to /dev/zero": func(p string) error { return os.Symlink("/dev/zero", p) },
		"a FIFO":                 func(p string) error { return unix.Mkfifo(p, 0o600) },
		"2 MiB":                  func(p string) error { return os.WriteFile(p, make([]byte, 2<<20), 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := plant(filepath.Join(dir, InfoName)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := ReadInfo(dir); done <- err }()
			select {
			case err := <-done:
				if err == nil {
					t.Error("read")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("ReadInfo waits")
			}
		})
	}
	if _, err := ReadInfo(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadInfo of an image without container.json = %v, want not-exist", err)
	}
}

// Run as root, runc's state directory counts only if root alone can change it and the way
// to it: a user who could replace a container's state.json there had root's gpucr freeze,
// dump and kill a root process of their choosing (hostile test).
func TestRuncRootOthersCanChangeIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the check is root's")
	}
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(open, "root", "evil"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := (&Runc{Root: filepath.Join(open, "root")}).CheckRoot(); !errors.Is(err, ErrUntrustedRoot) {
		t.Errorf("CheckRoot of a state directory under one all may write = %v, want ErrUntrustedRoot", err)
	}
	sticky := filepath.Join(t.TempDir(), "sticky")
	if err := os.Mkdir(sticky, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := (&Runc{Root: sticky}).CheckRoot(); !errors.Is(err, ErrUntrustedRoot) {
		t.Errorf("CheckRoot of a sticky state directory all may write (as /tmp) = %v, want ErrUntrustedRoot", err)
	}
	mine := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(mine, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := (&Runc{Root: mine}).CheckRoot(); err != nil {
		t.Errorf("CheckRoot of root's own state directory = %v", err)
	}
	if err := (&Runc{Root: filepath.Join(t.TempDir(), "none")}).CheckRoot(); err != nil {
		t.Errorf("CheckRoot of a state directory not made yet = %v", err)
	}
}

// Run as root, a container's own state directory and state.json count only if root alone
// can change them: a user's copy of a victim's state.json under a name of theirs had root's
// gpucr dump and kill the victim (hostile test).
func TestContainerStateOthersCanChangeIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the check is root's")
	}
	const nobody = 65534
	r := &Runc{Root: t.TempDir()}
	for name, plant := range map[string]func(dir, state string) error{
		"a user's state directory": func(dir, _ string) error { return os.Chown(dir, nobody, nobody) },
		"a user's state.json":      func(_, state string) error { return os.Chown(state, nobody, nobody) },
		"a state directory all may write": func(dir, _ string) error {
			return os.Chmod(dir, 0o777|os.ModeSticky)
		},
		"a state.json all may write": func(_, state string) error { return os.Chmod(state, 0o666) },
	} {
		t.Run(name, func(t *testing.T) {
			id := strings.ReplaceAll(name, " ", "-")
			dir := r.StateDir(id)
			state := filepath.Join(dir, "state.json")
			if err := os.Mkdir(dir, 0o711); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(state, []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := plant(dir, state); err != nil {
				t.Fatal(err)
			}
			if err := r.CheckState(id); !errors.Is(err, ErrUntrustedRoot) {
				t.Errorf("CheckState = %v, want ErrUntrustedRoot", err)
			}
		})
	}
	mine := r.StateDir("mine")
	if err := os.Mkdir(mine, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mine, "state.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.CheckState("mine"); err != nil {
		t.Errorf("CheckState of root's own container = %v", err)
	}
	if err := r.CheckState("none"); err != nil {
		t.Errorf("CheckState of no container = %v, want runc to say so", err)
	}
}
