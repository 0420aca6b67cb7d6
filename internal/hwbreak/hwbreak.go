// Package hwbreak tells whether this host delivers hardware breakpoints to traced
// processes, and what CRIU needs in its environment where it does not.
//
// CRIU runs parasite code inside each task it dumps or restores and catches the code's
// exit with a hardware breakpoint. Where the breakpoint never fires (a VM monitor that does
// not pass the debug registers through: seen on Linux 6.18 guests), every dump and restore
// waits for a stop that never comes. CRIU's fault injection 130 (FI_NO_BREAKPOINTS) makes
// it trace the parasite's syscalls up to its exit instead: slower by a few syscall stops,
// and the only switch CRIU has for it.
package hwbreak

import (
	"log/slog"
	"os"
	"os/exec"
	"sync"
)

// FaultVar is CRIU's fault-injection variable; NoBreakpoints is its value that turns
// hardware breakpoints off.
const (
	FaultVar      = "CRIU_FAULT"
	NoBreakpoints = "130"
)

// probe runs the host's check once per process: its answer cannot change while it runs.
var probe = sync.OnceValues(fires)

// Fire reports whether a hardware breakpoint set on a traced child stops it. An error says
// the check itself could not run (no ptrace, say); CRIU would then fail on its own terms.
func Fire() (bool, error) { return probe() }

// CRIUEnv is what CRIU's environment needs on this host: CRIU_FAULT=130 where hardware
// breakpoints never fire, nothing where they do, where the check could not run, or where
// the user set CRIU_FAULT already (theirs is kept).
func CRIUEnv() []string {
	if _, set := os.LookupEnv(FaultVar); set {
		return nil
	}
	ok, err := probe()
	if err != nil {
		slog.Debug("hardware breakpoint check failed; CRIU keeps its default", "err", err)
		return nil
	}
	if ok {
		return nil
	}
	slog.Debug("hardware breakpoints never fire on this host: CRIU traces its parasite's syscalls instead", FaultVar, NoBreakpoints)
	return []string{FaultVar + "=" + NoBreakpoints}
}

// Command is exec.Command for a CRIU binary (or a runtime that runs CRIU), with what CRIU
// needs on this host added to the environment it inherits.
func Command(path string, args ...string) *exec.Cmd {
	c := exec.Command(path, args...)
	c.Env = append(os.Environ(), CRIUEnv()...)
	return c
}
