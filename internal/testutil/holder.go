package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// holdEnv, set in a test binary's environment, turns that binary into a memory holder (see
// StartHolder) before any test runs: a test needs a process holding large resident
// anonymous memory, as a GPU process holds its staged device memory, and the test binary
// is the one program every test has.
const holdEnv = "GPUCR_TESTUTIL_HOLD_MIB"

// holdingName is a holder's name once its memory is written.
const holdingName = "gpucr-holding"

func init() {
	if v := os.Getenv(holdEnv); v != "" {
		mib, err := strconv.Atoi(v)
		if err != nil {
			os.Exit(2)
		}
		hold(mib)
	}
}

// hold maps mib MiB of anonymous memory, writes every page (byte i holds i*7 mod 251, so a
// restore can be checked), says so by its name (holdingName) and sleeps until killed.
func hold(mib int) {
	mem, err := syscall.Mmap(-1, 0, mib<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		os.Exit(3)
	}
	for i := range mem {
		mem[i] = byte(i * 7 % 251)
	}
	if err := os.WriteFile("/proc/self/comm", []byte(holdingName), 0); err != nil {
		os.Exit(4)
	}
	for {
		time.Sleep(time.Hour)
	}
}

// StartHolder starts a process, in a session of its own, that holds mib MiB of resident
// anonymous memory in one mapping, and returns once the memory is written. When the test
// ends its session is killed and it is reaped.
func StartHolder(t testing.TB, mib int) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), holdEnv+"="+strconv.Itoa(mib))
	return startNamed(t, cmd, holdingName, 30*time.Second, fmt.Sprintf("never got its %d MiB written", mib))
}
