package container

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Where the runc integration goes by default. runc hands CRIU /etc/criu/runc.conf (unless
// a container's org.criu.config annotation names another file), so every runc user, and
// podman and containerd through it, picks the action script up.
const (
	DefaultRuncConfig = "/etc/criu/runc.conf"
	DefaultScript     = "/usr/local/libexec/gpucr/criu-action"
	DefaultActionLog  = "/var/log/gpucr/criu-action.log"
)

// Integration is the runc integration's files: CRIU's configuration for runc, the action
// script it names, the copy of gpucr the script runs, and the log the script writes.
type Integration struct {
	Config string // CRIU configuration file runc passes to CRIU
	Script string // the action script; gpucr's copy goes beside it
	Log    string // where the action script logs each step
	Gpucr  string // the gpucr binary to install a copy of
}

// Binary is the copy of gpucr the action script runs, as root, on every CRIU run of runc.
func (in Integration) Binary() string { return filepath.Join(filepath.Dir(in.Script), "gpucr") }

// Install copies gpucr beside the action script, writes the script and adds it to the
// configuration, keeping the configuration's other lines. Each is replaced whole by rename:
// CRIU never reads half. The copy and the script live in a directory only root can change,
// so neither a user nor a moved or rebuilt binary changes what runs; the script checks that
// again before each run.
func (in Integration) Install() error {
	for _, p := range []string{in.Config, in.Script, in.Log, in.Gpucr} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%q is not an absolute path: CRIU runs the script from its own directory", p)
		}
	}
	dir := filepath.Dir(in.Script)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := rootOnly(dir); err != nil {
		return fmt.Errorf("refusing to install the runc integration into %s: %w", dir, err)
	}
	bin, err := os.ReadFile(in.Gpucr)
	if err != nil {
		return fmt.Errorf("copy gpucr: %w", err)
	}
	if err := writeAtomic(in.Binary(), bin, 0o755); err != nil {
		return err
	}
	if err := writeAtomic(in.Script, []byte(actionScript(in.Binary(), in.Log)), 0o755); err != nil {
		return err
	}
	lines, err := in.otherLines()
	if err != nil {
		return err
	}
	lines = append(lines, "action-script "+in.Script)
	return writeAtomic(in.Config, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// actionScript runs bin as CRIU's action script, once it has checked that bin and every
// directory above it belong to root and that no one else can write them (a root-owned
// sticky directory, like /tmp, cannot have root's entries replaced).
func actionScript(bin, log string) string {
	return fmt.Sprintf(`#!/bin/sh
# Written by gpucr install-runc-integration. CRIU runs this at each step of a dump or
# restore; gpucr moves the GPU state of the processes CRIU works on.
bin=%s
p=$bin
while :; do
	s=$(stat -c '%%u %%a' -- "$p") || exit 1
	u=${s%%%% *}; m=${s#* }
	if [ "$u" != 0 ] || { [ $((0$m & 18)) -ne 0 ] && [ $((0$m & 512)) -eq 0 ]; }; then
		echo "gpucr criu-action: refusing to run $bin: $p is not root's alone (owner $u, mode $m)" >&2
		exit 1
	fi
	[ "$p" = / ] && break
	p=$(dirname -- "$p")
done
exec "$bin" criu-action --log %s
`, shellQuote(bin), shellQuote(log))
}

// rootOnly checks that path and every directory above it belong to root and are writable by
// no one else, a root-owned sticky directory excepted.
func rootOnly(path string) error {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	for {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Uid != 0 {
			return fmt.Errorf("%s is not owned by root", p)
		}
		if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
			return fmt.Errorf("%s is writable by users other than root (mode %v)", p, fi.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
		p = filepath.Dir(p)
	}
}

// Remove takes the action script out of the configuration, removing the file if nothing
// else is left in it, and deletes the script and gpucr's copy.
func (in Integration) Remove() error {
	lines, err := in.otherLines()
	if err != nil {
		return err
	}
	if len(lines) == 0 {
		err = os.Remove(in.Config)
	} else {
		err = writeAtomic(in.Config, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	}
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("update %s: %w", in.Config, err)
	}
	for _, p := range []string{in.Script, in.Binary()} {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	return nil
}

// otherLines is the configuration without the lines that name this script.
func (in Integration) otherLines() ([]string, error) {
	b, err := os.ReadFile(in.Config)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", in.Config, err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(strings.ReplaceAll(sc.Text(), "=", " "))
		if len(f) == 2 && strings.TrimLeft(f[0], "-") == "action-script" && f[1] == in.Script {
			continue
		}
		out = append(out, sc.Text())
	}
	return out, nil
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
