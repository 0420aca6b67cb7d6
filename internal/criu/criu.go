// Package criu drives the CRIU binary over its RPC (criu swrk, in go-criu's protocol
// types): it finds a CRIU that is new enough and runs dump and restore with gpucr's options
// mapped in one place.
package criu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	gocriu "github.com/checkpoint-restore/go-criu/v7"
)

// MinVersion is the oldest CRIU gpucr drives (4.1): older releases fail on current kernels'
// vDSO layout and lack the features the GPU backends rely on. Encoded as go-criu does.
const MinVersion = 40100

// DefaultPrefixBinary is where scripts/install-deps.sh installs CRIU when the system's is too old.
const DefaultPrefixBinary = "/opt/gpucr/criu/sbin/criu"

// ErrNotFound and ErrTooOld say that this host cannot checkpoint until CRIU is installed.
var (
	ErrNotFound = errors.New("criu not found")
	ErrTooOld   = errors.New("criu is too old")
)

// Notify receives CRIU's notifications during dump and restore; embed NoNotify to
// implement only the ones needed.
type (
	Notify   = gocriu.Notify
	NoNotify = gocriu.NoNotify
)

// SeizedNotify is a Notify that also wants to know when CRIU holds every task of the tree
// it dumps stopped, before it has dumped anything: CRIU's "query-ext-files" notification,
// sent over the RPC only, right after it seized the tree.
type SeizedNotify interface {
	Notify
	Seized() error
}

// ResumingNotify is a Notify that also wants CRIU's "pre-resume" notification: every task
// restored and about to be let go. CRIU only logs a failure there and lets the tasks go:
// the caller removes them itself on its own error (review).
type ResumingNotify interface {
	Notify
	PreResume() error
}

// StartedNotify is a Notify that also wants CRIU's PID as soon as CRIU runs: what a
// restore's CRIU forks is the restore's, and a CRIU killed (not failing) leaves it behind.
type StartedNotify interface {
	Notify
	Started(pid int)
}

// Driver runs one CRIU binary.
type Driver struct {
	Path    string
	Version int // as go-criu encodes it: major*10000 + minor*100 + sublevel
}

// Find locates CRIU: path if given (the CLI's --criu or $GPUCR_CRIU), else the install
// script's prefix, else criu on PATH. It fails unless that CRIU is at least MinVersion.
func Find(path string) (*Driver, error) {
	path, err := Locate(path)
	if err != nil {
		return nil, err
	}
	c := gocriu.MakeCriu()
	c.SetCriuPath(path)
	v, err := c.GetCriuVersion()
	if err != nil {
		return nil, fmt.Errorf("%w: %s does not answer as CRIU: %v", ErrNotFound, path, err)
	}
	d := &Driver{Path: path, Version: v}
	if v < MinVersion {
		return nil, fmt.Errorf("%w: %s is version %s, gpucr needs %s or newer (run scripts/install-deps.sh)",
			ErrTooOld, path, d.VersionString(), FormatVersion(MinVersion))
	}
	return d, nil
}

// Locate is the path of the CRIU binary Find would run for path, without running it.
func Locate(path string) (string, error) {
	if path != "" {
		p, err := exec.LookPath(path)
		if err != nil {
			return "", fmt.Errorf("%w at %s: %v", ErrNotFound, path, err)
		}
		return filepath.Abs(p)
	}
	if fi, err := os.Stat(DefaultPrefixBinary); err == nil && !fi.IsDir() {
		return DefaultPrefixBinary, nil
	}
	p, err := exec.LookPath("criu")
	if err != nil {
		return "", fmt.Errorf("%w on PATH or at %s (run scripts/install-deps.sh)", ErrNotFound, DefaultPrefixBinary)
	}
	return p, nil
}

// VersionString is the driver's CRIU version as "4.1.1".
func (d *Driver) VersionString() string { return FormatVersion(d.Version) }

// FormatVersion renders go-criu's version number as "major.minor.sublevel".
func FormatVersion(v int) string {
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
}
