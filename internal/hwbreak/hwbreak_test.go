package hwbreak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testutil"
)

// dumpWithin runs a real `criu dump --leave-running` of a sleeping process, with extra env,
// and reports whether it finished within limit.
func dumpWithin(t *testing.T, criu string, env []string, limit time.Duration) (bool, string) {
	t.Helper()
	pid := testutil.StartSleeper(t).Process.Pid
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, criu, "dump", "-t", strconv.Itoa(pid), "-D", dir, "--leave-running", "-v1", "-o", "dump.log")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return false, "timed out"
	}
	if err != nil {
		log, _ := os.ReadFile(dir + "/dump.log")
		t.Fatalf("criu dump: %v: %s\n%s", err, out, log)
	}
	return true, ""
}

// The check's answer is CRIU's: where it says breakpoints fire, a dump without help
// finishes; where it says they never do, such a dump hangs and one with CRIUEnv finishes.
// Either wrong answer fails: a hang left in every dump, or a host told to step for nothing.
func TestCheckAgreesWithCRIU(t *testing.T) {
	criu := os.Getenv("GPUCR_CRIU")
	if criu == "" {
		criu = "/opt/gpucr/criu/sbin/criu"
	}
	if _, err := os.Stat(criu); err != nil || os.Geteuid() != 0 {
		testutil.SkipOrFail(t, fmt.Sprintf("need root and criu at %s (euid %d, %v)", criu, os.Geteuid(), err))
	}
	t.Setenv(FaultVar, "") // restored when the test ends; unset, so that the check decides
	if err := os.Unsetenv(FaultVar); err != nil {
		t.Fatal(err)
	}
	fire, err := Fire()
	if err != nil {
		t.Fatalf("check failed: %v", err)
	}
	// A dump of a sleeping process takes well under a second; a hung one never ends.
	const limit = 15 * time.Second
	done, why := dumpWithin(t, criu, nil, limit)
	t.Logf("breakpoints fire: %v; plain dump finished: %v %s", fire, done, why)
	if fire != done {
		t.Fatalf("check says breakpoints fire=%v, but a plain CRIU dump finished=%v (%s)", fire, done, why)
	}
	env := CRIUEnv()
	if fire != (len(env) == 0) {
		t.Fatalf("breakpoints fire=%v, CRIUEnv = %q", fire, env)
	}
	if !fire {
		if done, why := dumpWithin(t, criu, env, limit); !done {
			t.Fatalf("a dump with %q did not finish either: %s", env, why)
		}
	}
}

// A CRIU_FAULT the user set is theirs: gpucr adds none of its own.
func TestUsersFaultSettingIsKept(t *testing.T) {
	t.Setenv(FaultVar, "0")
	if env := CRIUEnv(); env != nil {
		t.Fatalf("CRIUEnv with CRIU_FAULT set = %q, want nothing", env)
	}
}
