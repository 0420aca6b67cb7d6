package hwbreak

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// debugRegs is offsetof(struct user, u_debugreg) on x86-64, where PTRACE_POKEUSER writes
// the debug registers: 27 general registers, u_fpvalid and its padding, the 512-byte FXSAVE
// area, then ten words and the 32-byte u_comm (<sys/user.h>).
const debugRegs = 848

// dr7Local0 enables DR0 locally as an execution breakpoint of length 1, as CRIU sets it.
const dr7Local0 = 1

// fires starts `true` traced, puts an execution breakpoint on the instruction it stopped at
// after exec, and lets it go on: where breakpoints work it stops there at once with
// SIGTRAP, where they do not it runs to its exit. Either way the answer is quick.
func fires() (bool, error) {
	path, err := traceable()
	if err != nil {
		return false, err
	}
	// Every ptrace request must come from the thread that became the tracer.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, err := syscall.ForkExec(path, []string{"true"}, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Ptrace: true}})
	if err != nil {
		return false, fmt.Errorf("start traced child: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			_, _ = wait(pid)
		}
	}()
	if ws, err := wait(pid); err != nil || !ws.Stopped() {
		return false, fmt.Errorf("traced child did not stop at exec (%v, %v)", ws, err)
	}
	var regs syscall.PtraceRegs
	if err := syscall.PtraceGetRegs(pid, &regs); err != nil {
		return false, fmt.Errorf("read traced child's registers: %w", err)
	}
	if err := pokeUser(pid, debugRegs, uintptr(regs.Rip)); err != nil {
		return false, fmt.Errorf("set DR0: %w", err)
	}
	if err := pokeUser(pid, debugRegs+7*8, dr7Local0); err != nil {
		return false, fmt.Errorf("enable DR0: %w", err)
	}
	if err := syscall.PtraceCont(pid, 0); err != nil {
		return false, fmt.Errorf("continue traced child: %w", err)
	}
	ws, err := wait(pid)
	if err != nil {
		return false, err
	}
	if ws.Exited() || ws.Signaled() {
		done = true
		return false, nil
	}
	if ws.Stopped() && ws.StopSignal() == syscall.SIGTRAP {
		return true, nil
	}
	return false, fmt.Errorf("traced child stopped by %v, not the breakpoint", ws.StopSignal())
}

// traceable finds `true`: in PATH, or where Debian and others put it, for a gpucr started
// with a bare environment (by a container runtime's hook, say).
func traceable() (string, error) {
	if path, err := exec.LookPath("true"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/bin/true", "/bin/true"} {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("no program to trace: no true in PATH, /usr/bin or /bin")
}

func pokeUser(pid int, offset, value uintptr) error {
	if _, _, e := syscall.Syscall6(syscall.SYS_PTRACE, syscall.PTRACE_POKEUSR, uintptr(pid), offset, value, 0, 0); e != 0 {
		return e
	}
	return nil
}

func wait(pid int) (syscall.WaitStatus, error) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			return ws, err
		}
	}
}
