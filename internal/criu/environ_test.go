package criu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testutil"
)

// CRIU reads $HOME/.criu/default.conf and $CRIU_CONFIG_FILE before its first step and runs,
// as root, the action scripts they name: root's gpucr run in a user's environment had CRIU
// run the user's script (hostile test, HOME=/home/user with .criu/default.conf). The CRIU
// gpucr starts gets root's own home, and a CRIU_CONFIG_FILE others could change is refused
// before CRIU starts. A stand-in CRIU records the environment it was given.
func TestCRIUGetsNoUsersConfiguration(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the home and the file must be another user's")
	}
	userHome := t.TempDir()
	conf := filepath.Join(userHome, ".criu", "default.conf")
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("action-script /bin/true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{userHome, filepath.Dir(conf), conf} {
		if err := os.Chown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	seen := filepath.Join(dir, "env")
	fake := filepath.Join(dir, "criu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nenv > "+seen+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", userHome)
	s, err := startSwrk(fake, nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
	s.sk.Close()
	env, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "HOME="+userHome+"\n") {
		t.Fatalf("CRIU was given the user's home %s", userHome)
	}
	t.Setenv("CRIU_CONFIG_FILE", conf)
	done := make(chan error, 1)
	go func() {
		s, err := startSwrk(fake, nil, false, false)
		if err == nil {
			_ = s.cmd.Wait()
			s.sk.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "CRIU_CONFIG_FILE") {
			t.Fatalf("CRIU started with a CRIU_CONFIG_FILE of a user's: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("startSwrk did not return")
	}
}

// CRIU loads every plugin in $CRIU_LIBS_DIR, as root, where gpucr names no plugin
// directory (runc's CRIU, a checkpoint without GPU plugins): a user's directory there, in
// the environment of root's gpucr, had CRIU load that user's library as it does a user's
// configuration file's action script. Both are refused; root's own are kept.
func TestCRIUGetsNoUsersPaths(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the paths must be another user's")
	}
	users, roots := t.TempDir(), t.TempDir()
	for _, p := range []string{filepath.Join(users, "default.conf"), filepath.Join(roots, "default.conf")} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{users, filepath.Join(users, "default.conf")} {
		if err := os.Chown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct{ name, users, roots string }{
		{"CRIU_CONFIG_FILE", filepath.Join(users, "default.conf"), filepath.Join(roots, "default.conf")},
		{"CRIU_LIBS_DIR", users, roots},
	} {
		t.Setenv(tt.name, tt.users)
		if _, err := Environ(); err == nil || !strings.Contains(err.Error(), tt.name) {
			t.Errorf("%s=%s, a user's: %v; want it refused", tt.name, tt.users, err)
		}
		t.Setenv(tt.name, tt.roots)
		if env, err := Environ(); err != nil || !slices.Contains(env, tt.name+"="+tt.roots) {
			t.Errorf("%s=%s, root's: %v; want it kept", tt.name, tt.roots, err)
		}
		t.Setenv(tt.name, "")
		if env, err := Environ(); err != nil || slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, tt.name+"=") }) {
			t.Errorf("%s set empty: %v; want it left out, not refused", tt.name, err)
		}
		_ = os.Unsetenv(tt.name)
	}
}
