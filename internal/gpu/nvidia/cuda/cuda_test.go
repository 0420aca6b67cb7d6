package cuda

import (
	"errors"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// timeoutPID is the pid whose lock the fake driver always times out.
const timeoutPID = 999999

// buildFake compiles testdata/fakecuda.c into a fresh library, so each test starts with an
// empty process table.
func buildFake(t *testing.T, defines ...string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	lib := filepath.Join(t.TempDir(), "libfakecuda.so")
	args := append([]string{"-shared", "-fPIC", "-o", lib}, defines...)
	out, err := exec.Command(cc, append(args, "testdata/fakecuda.c")...).CombinedOutput()
	if err != nil {
		t.Fatalf("build fake libcuda: %v\n%s", err, out)
	}
	return lib
}

// openFake opens a fresh fake driver, as gpucr's tests on hosts without a GPU do (through
// $GPUCR_LIBCUDA), and returns it with the path of its call log.
func openFake(t *testing.T) (*Driver, string) {
	t.Helper()
	lib := buildFake(t)
	log := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("FAKECUDA_LOG", log)
	d, err := Open(lib)
	if err != nil {
		t.Fatalf("Open fake: %v", err)
	}
	return d, log
}

func callLog(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read fake driver log: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func code(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestStateTransitions(t *testing.T) {
	const (
		ok           = 0
		invalid      = 1
		illegalState = 401
		timedOut     = 909
	)
	type step struct {
		op        string // lock, checkpoint, restore, unlock
		wantCode  int
		wantState int
	}
	cases := []struct {
		name  string
		pid   int
		steps []step
	}{
		{"full cycle", 101, []step{
			{"lock", ok, StateLocked}, {"checkpoint", ok, StateCheckpointed},
			{"restore", ok, StateLocked}, {"unlock", ok, StateRunning},
		}},
		{"unlock without checkpoint", 102, []step{{"lock", ok, StateLocked}, {"unlock", ok, StateRunning}}},
		{"checkpoint needs a lock", 103, []step{{"checkpoint", illegalState, StateRunning}}},
		{"restore needs a checkpoint", 104, []step{{"restore", illegalState, StateRunning}, {"lock", ok, StateLocked}, {"restore", illegalState, StateLocked}}},
		{"unlock needs a lock", 105, []step{{"unlock", illegalState, StateRunning}}},
		{"no double lock", 106, []step{{"lock", ok, StateLocked}, {"lock", illegalState, StateLocked}}},
		{"no unlock while checkpointed", 107, []step{{"lock", ok, StateLocked}, {"checkpoint", ok, StateCheckpointed}, {"unlock", illegalState, StateCheckpointed}}},
		{"lock timeout leaves it running", timeoutPID, []step{{"lock", timedOut, StateRunning}}},
		{"bad pid", -1, []step{{"lock", invalid, -1}}},
	}
	d, _ := openFake(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for i, s := range c.steps {
				var err error
				switch s.op {
				case "lock":
					err = d.Lock(c.pid, time.Second)
				case "checkpoint":
					err = d.Checkpoint(c.pid)
				case "restore":
					err = d.Restore(c.pid, nil)
				case "unlock":
					err = d.Unlock(c.pid)
				}
				if got := code(err); got != s.wantCode {
					t.Fatalf("step %d %s: err = %v, want code %d", i, s.op, err, s.wantCode)
				}
				if s.wantState < 0 {
					continue
				}
				st, err := d.State(c.pid)
				if err != nil || st != s.wantState {
					t.Fatalf("step %d %s: State = %d, %v; want %d", i, s.op, st, err, s.wantState)
				}
			}
		})
	}
}

func TestErrorNamesTheCall(t *testing.T) {
	d, _ := openFake(t)
	err := d.Lock(timeoutPID, time.Second)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("Lock = %v, want *Error", err)
	}
	want := Error{Call: "cuCheckpointProcessLock", Code: 909, Name: "CUDA_ERROR_TIMEOUT", Message: "the operation timed out"}
	if *e != want {
		t.Fatalf("Lock error = %+v, want %+v", *e, want)
	}
	if got := err.Error(); got != "cuCheckpointProcessLock: CUDA_ERROR_TIMEOUT (909): the operation timed out" {
		t.Fatalf("Error() = %q", got)
	}
	if _, err := d.State(0); err == nil || err.Error() != "cuCheckpointProcessGetState: CUDA_ERROR_INVALID_VALUE (1): invalid argument" {
		t.Fatalf("State(0) = %v", err)
	}
}

func TestErrorText(t *testing.T) {
	cases := []struct {
		err  Error
		want string
	}{
		{Error{"cuCheckpointProcessRestore", 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"}, "cuCheckpointProcessRestore: CUDA_ERROR_NOT_SUPPORTED (801): operation not supported"},
		{Error{"cuCheckpointProcessRestore", 12345, "", ""}, "cuCheckpointProcessRestore: CUDA error (12345)"},
	}
	for _, c := range cases {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
	}
}

func TestLockPassesTimeout(t *testing.T) {
	d, log := openFake(t)
	for pid, timeout := range map[int]time.Duration{201: 1500 * time.Millisecond, 202: 0, 203: time.Microsecond} {
		if err := d.Lock(pid, timeout); err != nil {
			t.Fatalf("Lock(%d, %v): %v", pid, timeout, err)
		}
	}
	got := map[string]bool{}
	for _, l := range callLog(t, log) {
		got[l] = true
	}
	for _, want := range []string{"lock 201 timeout=1500", "lock 202 timeout=0", "lock 203 timeout=1"} {
		if !got[want] {
			t.Errorf("driver log %v lacks %q", got, want)
		}
	}
}

func TestTimeoutMs(t *testing.T) {
	cases := []struct {
		in   time.Duration
		want uint32
	}{
		{-time.Second, 0},
		{0, 0},
		{time.Nanosecond, 1},
		{time.Millisecond, 1},
		{1500*time.Millisecond + 1, 1501},
		{time.Minute, 60000},
		{math.MaxInt64, math.MaxUint32},
	}
	for _, c := range cases {
		if got := timeoutMs(c.in); got != c.want {
			t.Errorf("timeoutMs(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestRestorePassesPairs(t *testing.T) {
	var a, b [16]byte
	for i := range a {
		a[i], b[i] = byte(i), byte(0xf0+i)
	}
	ah, bh := "000102030405060708090a0b0c0d0e0f", "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"
	cases := []struct {
		name  string
		pairs []GPUPair
		want  string
	}{
		{"same GPUs", nil, "pairs=0"},
		{"one pair", []GPUPair{{Old: a, New: a}}, "pairs=1 " + ah + ">" + ah},
		{"swap", []GPUPair{{Old: a, New: b}, {Old: b, New: a}}, "pairs=2 " + ah + ">" + bh + " " + bh + ">" + ah},
	}
	d, log := openFake(t)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pid := 300 + i
			if err := d.Lock(pid, 0); err != nil {
				t.Fatal(err)
			}
			if err := d.Checkpoint(pid); err != nil {
				t.Fatal(err)
			}
			if err := d.Restore(pid, c.pairs); err != nil {
				t.Fatal(err)
			}
			lines := callLog(t, log)
			if got, want := lines[len(lines)-1], "restore "+strconv.Itoa(pid)+" "+c.want; got != want {
				t.Fatalf("driver saw %q, want %q", got, want)
			}
		})
	}
}

func TestVersionAndL2CacheSizes(t *testing.T) {
	d, _ := openFake(t)
	v, err := d.Version()
	if err != nil || v != 13000 {
		t.Fatalf("Version() = %d, %v; want 13000", v, err)
	}
	var u0, u1 [16]byte
	for i := range u0 {
		u0[i], u1[i] = byte(i), byte(16+i)
	}
	got, err := d.L2CacheSizes()
	want := map[string]uint64{FormatUUID(u0): 50 << 20, FormatUUID(u1): 49 << 20}
	if err != nil || !maps.Equal(got, want) {
		t.Fatalf("L2CacheSizes() = %v, %v; want %v", got, err, want)
	}
}

func TestOpenErrors(t *testing.T) {
	cases := []struct {
		name  string
		path  func(t *testing.T) string
		wants []string
	}{
		{"no such library", func(*testing.T) string { return "/nonexistent/libcuda.so.1" },
			[]string{"load CUDA driver library", "/nonexistent/libcuda.so.1"}},
		{"driver without the checkpoint API", func(t *testing.T) string { return buildFake(t, "-DOMIT_CHECKPOINT_API") },
			[]string{"has no cuCheckpointProcess", "too old", "550", "580"}},
		{"not libcuda", func(t *testing.T) string { return buildFake(t, "-DOMIT_CORE_API") },
			[]string{"not a CUDA driver library", "cuDriverGetVersion"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			if _, err := Open(path); err == nil || !containsAll(err.Error(), c.wants) {
				t.Fatalf("Open(%s) = %v, want an error with %q", path, err, c.wants)
			}
		})
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func TestUUID(t *testing.T) {
	const h100 = "GPU-5f1c3a2b-9d8e-4f70-a1b2-c3d4e5f60718"
	u, err := ParseUUID(h100)
	if err != nil {
		t.Fatal(err)
	}
	if u[0] != 0x5f || u[15] != 0x18 {
		t.Fatalf("ParseUUID(%s) = %x", h100, u)
	}
	if got := FormatUUID(u); got != h100 {
		t.Fatalf("FormatUUID(ParseUUID(%s)) = %s", h100, got)
	}
	if u2, err := ParseUUID(strings.ToUpper(h100[4:])); err == nil {
		t.Fatalf("ParseUUID without GPU- prefix = %x, want an error", u2)
	}
	if u2, err := ParseUUID("GPU-" + strings.ToUpper(h100[4:])); err != nil || u2 != u {
		t.Fatalf("ParseUUID of upper case = %x, %v; want %x", u2, err, u)
	}
	for _, bad := range []string{
		"",
		"GPU-",
		"MIG-5f1c3a2b-9d8e-4f70-a1b2-c3d4e5f60718",
		"GPU-5f1c3a2b9d8e4f70a1b2c3d4e5f60718",
		"GPU-5f1c3a2b-9d8e-4f70-a1b2-c3d4e5f6071",
		"GPU-5f1c3a2b-9d8e-4f70-a1b2c3-d4e5f60718",
		"GPU-5f1c3a2b-9d8e-4f70-a1b2-c3d4e5f6071z",
		"0",
	} {
		if _, err := ParseUUID(bad); err == nil || !strings.Contains(err.Error(), "bad GPU UUID") {
			t.Errorf("ParseUUID(%q) = %v, want a bad GPU UUID error", bad, err)
		}
	}
}
