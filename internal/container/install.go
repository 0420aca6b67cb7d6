package container

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
// script it names, and the log the script writes.
type Integration struct {
	Config string // CRIU configuration file runc passes to CRIU
	Script string // the action script
	Log    string // where the action script logs each step
	Gpucr  string // the gpucr binary the script runs
}

// Install writes the action script and adds it to the configuration, keeping the
// configuration's other lines. Both are replaced whole by rename: CRIU never reads half.
func (in Integration) Install() error {
	for _, p := range []string{in.Config, in.Script, in.Log, in.Gpucr} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%q is not an absolute path: CRIU runs the script from its own directory", p)
		}
	}
	script := fmt.Sprintf("#!/bin/sh\n# Written by gpucr install-runc-integration. CRIU runs this at each step of a dump or\n# restore; gpucr moves the GPU state of the processes CRIU works on.\nexec %s criu-action --log %s\n",
		shellQuote(in.Gpucr), shellQuote(in.Log))
	if err := writeAtomic(in.Script, []byte(script), 0o755); err != nil {
		return err
	}
	lines, err := in.otherLines()
	if err != nil {
		return err
	}
	lines = append(lines, "action-script "+in.Script)
	return writeAtomic(in.Config, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// Remove takes the action script out of the configuration, removing the file if nothing
// else is left in it, and deletes the script.
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
	if err := os.Remove(in.Script); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove %s: %w", in.Script, err)
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
