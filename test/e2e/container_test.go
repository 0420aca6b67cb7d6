package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// These tests checkpoint and restore real runc containers with real CRIU: through gpucr,
// and through plain runc with the runc integration installed. They need root, runc,
// busybox and CRIU; under CI=true a missing prerequisite fails them.

// needRunc returns runc and the CRIU gpucr uses, skipping (or under CI failing) without them.
func needRunc(t *testing.T) (runc, criuPath string) {
	t.Helper()
	needCRIU(t)
	why := ""
	runc, err := exec.LookPath("runc")
	if err != nil {
		why = "no runc (run scripts/install-deps.sh)"
	} else if _, err := os.Stat("/bin/busybox"); err != nil {
		why = "no /bin/busybox for the container's rootfs (busybox-static)"
	}
	d, err := criu.Find(os.Getenv("GPUCR_CRIU"))
	if err != nil {
		why = err.Error()
	}
	if why != "" {
		testutil.SkipOrFail(t, why)
	}
	return runc, d.Path
}

// counterBundle makes an OCI bundle whose container counts into /count ten times a second.
// It shares the host's network namespace: a namespace of its own would need iptables for
// CRIU's network lock, which has nothing to do with what these tests prove. criuConfig,
// when not empty, is the CRIU configuration runc hands to CRIU for this container. With
// counterArgs the container runs the test counter with them instead of a shell loop: it
// counts into the same /count and re-checks its memory on SIGUSR1.
func counterBundle(t *testing.T, runc, criuConfig string, counterArgs ...string) string {
	t.Helper()
	b := t.TempDir()
	binDir := filepath.Join(b, "rootfs", "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(binDir, a)); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := hwbreak.Command(runc, "spec", "--bundle", b).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	if counterArgs != nil {
		counter, err := os.ReadFile(bin.counter)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(b, "rootfs", "counter"), counter, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	testutil.EditJSON(t, filepath.Join(b, "config.json"), func(spec map[string]any) {
		proc := spec["process"].(map[string]any)
		proc["terminal"] = false
		proc["args"] = []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /count; sleep 0.1; done"}
		if counterArgs != nil {
			proc["args"] = append([]string{"/counter", "-dir", "/", "-tick", "20ms"}, counterArgs...)
		}
		spec["root"].(map[string]any)["readonly"] = false
		linux := spec["linux"].(map[string]any)
		var ns []any
		for _, n := range linux["namespaces"].([]any) {
			if n.(map[string]any)["type"] != "network" {
				ns = append(ns, n)
			}
		}
		linux["namespaces"] = ns
		if criuConfig != "" {
			spec["annotations"] = map[string]string{"org.criu.config": criuConfig}
		}
	})
	return b
}

// containerID is a fresh container name, removed (with whatever runs under it) at cleanup.
func containerID(t *testing.T, runc, name string) string {
	id := fmt.Sprintf("gpucr-test-%d-%s", os.Getpid(), name)
	t.Cleanup(func() {
		_ = hwbreak.Command(runc, "delete", "--force", id).Run()
		testutil.Reap()
	})
	return id
}

func runcRun(t *testing.T, runc, bundle, id string) {
	t.Helper()
	mustRunc(t, runc, "run", "--detach", "--bundle", bundle, id)
}

// mustRunc runs runc with /dev/null for stdio and its errors in its --log file: a
// detached container keeps runc's stdio, where a pipe would never reach EOF and a file
// outside the container is one CRIU cannot dump.
func mustRunc(t *testing.T, runc string, args ...string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "runc.log")
	if err := hwbreak.Command(runc, append([]string{"--log", log}, args...)...).Run(); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("runc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// count reads the container's counter, 0 before its first write.
func count(t *testing.T, bundle string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bundle, "rootfs", "count"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func waitContainerCount(t *testing.T, bundle string, atLeast int) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if n := count(t, bundle); n >= atLeast {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("container count did not reach %d (at %d)", atLeast, count(t, bundle))
	return 0
}

// checkCountsOn proves the restored container went on from its checkpointed memory: its
// next counts follow on from frozen instead of starting again from 1.
func checkCountsOn(t *testing.T, bundle string, frozen int) {
	t.Helper()
	n := waitContainerCount(t, bundle, frozen+3)
	if n > frozen+30 {
		t.Fatalf("count jumped from %d to %d", frozen, n)
	}
}

func gone(runc, id string) bool {
	return hwbreak.Command(runc, "state", id).Run() != nil
}

func TestContainerCheckpointRestoreThroughGpucr(t *testing.T) {
	runc, _ := needRunc(t)
	bundle := counterBundle(t, runc, "")
	id, id2 := containerID(t, runc, "a"), containerID(t, runc, "a2")
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 5)

	dir := filepath.Join(t.TempDir(), "img")
	out := mustGpucr(t, "checkpoint", "--container", id, "-D", dir)
	if !strings.Contains(out, "checkpointed container "+id) {
		t.Errorf("summary: %s", out)
	}
	if !gone(runc, id) {
		t.Fatal("the container still exists after a checkpoint without --leave-running")
	}
	frozen := count(t, bundle)
	time.Sleep(300 * time.Millisecond)
	if n := count(t, bundle); n != frozen {
		t.Fatalf("the container kept counting after its checkpoint: %d -> %d", frozen, n)
	}
	mustGpucr(t, "verify", dir)
	if out := mustGpucr(t, "inspect", dir); !strings.Contains(out, "container "+id) || !strings.Contains(out, " sh ") {
		t.Errorf("inspect:\n%s", out)
	}
	if out, code := gpucr(t, "restore", "--container", "other", "-D", dir); code == 0 || !strings.Contains(out, "holds container "+id) {
		t.Errorf("restore under the wrong ID: exit %d: %s", code, out)
	}

	out = mustGpucr(t, "restore", "--container", id, "-D", dir, "--new-id", id2)
	if !strings.Contains(out, "restored container "+id2) {
		t.Errorf("summary: %s", out)
	}
	checkCountsOn(t, bundle, frozen)
}

func TestContainerLeaveRunningAndFailedCheckpointKeepItRunning(t *testing.T) {
	runc, _ := needRunc(t)
	// A container whose stdout is a host file outside its mounts: CRIU cannot dump it, so
	// the checkpoint fails inside runc, after gpucr paused the container.
	bad := counterBundle(t, runc, "")
	badID := containerID(t, runc, "bad")
	stdout, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	run := hwbreak.Command(runc, "run", "--detach", "--bundle", bad, badID)
	run.Stdout, run.Stderr = stdout, stdout
	if err := run.Run(); err != nil {
		t.Fatalf("runc run: %v", err)
	}
	waitContainerCount(t, bad, 3)
	out, code := gpucr(t, "checkpoint", "--container", badID, "-D", filepath.Join(t.TempDir(), "img"))
	if code == 0 {
		t.Fatalf("checkpoint of an undumpable container succeeded: %s", out)
	}
	// CRIU's first error line, and its log kept where the error says: runc's message named
	// the log in the image's staging directory, removed by then (tester's report).
	if log := keptCRIULog(out); !strings.Contains(out, "criu dump failed: (") || !strings.Contains(out, ") Error (") || log == "" {
		t.Errorf("the failure quotes no CRIU error line or names no kept log: %s", out)
	} else {
		os.Remove(log)
	}
	n := count(t, bad)
	waitContainerCount(t, bad, n+3) // rolled back: running, not left paused

	bundle := counterBundle(t, runc, "")
	id := containerID(t, runc, "b")
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 3)
	dir := filepath.Join(t.TempDir(), "img")
	out = mustGpucr(t, "checkpoint", "--container", id, "-D", dir, "--leave-running")
	if !strings.Contains(out, "left running") {
		t.Errorf("summary: %s", out)
	}
	n = count(t, bundle)
	waitContainerCount(t, bundle, n+3) // running, not left paused
}

// keptCRIULog is the CRIU log that gpucr's error out names, "" unless it is there.
func keptCRIULog(out string) string {
	_, log, ok := strings.Cut(out, "(log: ")
	if log, _, _ = strings.Cut(log, ")"); !ok {
		return ""
	}
	if _, err := os.Stat(log); err != nil {
		return ""
	}
	return log
}

// Plain runc with the integration: a container without GPU state is checkpointed and
// restored with gpucr never started; one holding a GPU device (a stand-in, with the fake
// driver) starts gpucr once for its dump, and its restore on a host without the GPU driver
// is refused with gpucr's one line on runc's stderr and in the CRIU log runc names.
func TestPlainRuncWithIntegration(t *testing.T) {
	runc, criuPath := needRunc(t)
	tmp := t.TempDir()
	conf, script, log := filepath.Join(tmp, "runc.conf"), filepath.Join(tmp, "criu-action"), filepath.Join(tmp, "action.log")
	mustGpucr(t, "install-criu-integration", "--config", conf, "--crun-config", "", "--script", script, "--log", log,
		"--state-dir", filepath.Join(tmp, "state"))
	// The annotation points runc at this test's configuration instead of /etc/criu/runc.conf,
	// so that the test leaves the host's runc as it found it.
	bundle := counterBundle(t, runc, conf)
	id, id2 := containerID(t, runc, "c"), containerID(t, runc, "c2")
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 5)

	img := filepath.Join(tmp, "img")
	mustRunc(t, runc, "--criu", criuPath, "checkpoint", "--image-path", img, "--work-path", filepath.Join(tmp, "work"), id)
	frozen := count(t, bundle)
	if out := mustGpucr(t, "inspect", img); !strings.Contains(out, "runc/CRIU checkpoint") || !strings.Contains(out, " sh ") {
		t.Errorf("inspect of runc's checkpoint:\n%s", out)
	}
	mustRunc(t, runc, "--criu", criuPath, "restore", "--detach", "--image-path", img, "--work-path", filepath.Join(tmp, "work2"), "--bundle", bundle, id2)
	checkCountsOn(t, bundle, frozen)
	if logged, err := os.ReadFile(log); !os.IsNotExist(err) {
		t.Fatalf("gpucr started for a container without GPU state; its log:\n%s", logged)
	}
	if b, _ := os.ReadFile(filepath.Join(tmp, "work", "dump.log")); !bytes.Contains(b, []byte(script)) {
		t.Fatal("CRIU did not run the action script: the test proves nothing")
	}

	drv := newFakeDriver(t)
	gpuBundle := counterBundle(t, runc, conf)
	holdGPUDevice(t, gpuBundle)
	id3, id4 := containerID(t, runc, "c3"), containerID(t, runc, "c4")
	runcRun(t, runc, gpuBundle, id3)
	waitContainerCount(t, gpuBundle, 3)
	drv.claim(t, runcInitPID(t, runc, id3))
	gpuImg := filepath.Join(tmp, "gpu-img")
	ck := hwbreak.Command(runc, "--criu", criuPath, "checkpoint", "--image-path", gpuImg, "--work-path", filepath.Join(tmp, "work3"), id3)
	ck.Env = append(ck.Env, drv.env...)
	if out, err := ck.CombinedOutput(); err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("runc checkpoint of a GPU container: %v: %s\ngpucr's log:\n%s", err, out, b)
	}
	logged, _ := os.ReadFile(log)
	if n := strings.Count(string(logged), "action=pre-dump"); n != 1 || !strings.Contains(string(logged), "GPU state checkpointed") {
		t.Fatalf("gpucr's log of the dump, want one pre-dump line that checkpointed GPU state:\n%s", logged)
	}
	if _, err := os.Stat(filepath.Join(gpuImg, "gpucr-gpus.json")); err != nil {
		t.Fatalf("no GPU record in the image: %v", err)
	}

	stderr := filepath.Join(tmp, "restore.stderr")
	// Appended to, as a terminal or a pipe would be: runc's own writes do not overwrite gpucr's.
	f, err := os.OpenFile(stderr, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	rs := hwbreak.Command(runc, "--criu", criuPath, "restore", "--detach", "--image-path", gpuImg, "--work-path", filepath.Join(tmp, "work4"), "--bundle", gpuBundle, id4)
	rs.Stdout, rs.Stderr = f, f
	err = rs.Run()
	f.Close()
	out, _ := os.ReadFile(stderr)
	if err == nil {
		t.Fatalf("runc restored GPU state onto a host without the GPU driver:\n%s", out)
	}
	const reason = "gpucr: Error (CRIU action pre-restore): "
	first, _, _ := strings.Cut(string(out), "\n")
	if !strings.HasPrefix(first, reason) || !strings.Contains(first, "gpucr's log: "+log) {
		t.Errorf("runc's stderr does not start with gpucr's reason:\n%s", out)
	}
	if b, _ := os.ReadFile(filepath.Join(tmp, "work4", "restore.log")); !bytes.Contains(b, []byte(reason)) {
		t.Errorf("the CRIU log runc names lacks gpucr's reason:\n%s", b)
	}
	logged, _ = os.ReadFile(log)
	if n := strings.Count(string(logged), "action=pre-restore"); n != 1 {
		t.Errorf("gpucr logged pre-restore %d times, want once:\n%s", n, logged)
	}
}

// A container restored through runc and the integration gets its GPU state onto the GPU
// its own /dev holds (/dev/nvidia1, the fake host's second GPU), not back onto the image's
// GPU 0, which the host still has free: what a node's device plugin or CDI gave the
// restored container is all its processes can open. One given no GPU at all is refused,
// its restored processes killed rather than left running without their GPU state.
func TestIntegrationRestoresOntoTheContainersGPU(t *testing.T) {
	const gpu0, gpu1 = "000102030405060708090a0b0c0d0e0f", "101112131415161718191a1b1c1d1e1f" // fakenvml.c's UUIDs
	t.Run("given GPU 1", func(t *testing.T) {
		g := integrationGPURoundTrip(t, map[string]any{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 0o666})
		if !strings.Contains(g.gpucrLog(), "GPU state restored") {
			t.Fatalf("the integration did not restore the GPU state; its log:\n%s\nthe driver's calls:\n%s", g.gpucrLog(), g.driverCalls())
		}
		checkCountsOn(t, g.bundle, g.frozen)
		// The driver takes a permutation of every GPU: GPU 0's state goes to 1, and 1's to 0.
		if !strings.Contains(g.driverCalls(), " "+gpu0+">"+gpu1) {
			t.Fatalf("the driver was not asked to restore GPU 0's state onto GPU 1, the container's; its calls:\n%s\ngpucr's log:\n%s", g.driverCalls(), g.gpucrLog())
		}
		if !strings.Contains(g.gpucrLog(), "GPU moved") {
			t.Errorf("the integration did not log the move:\n%s", g.gpucrLog())
		}
	})
	t.Run("given none", func(t *testing.T) {
		g := integrationGPURoundTrip(t, map[string]any{"path": "/dev/nvidia0", "type": "b", "major": 195, "minor": 0, "fileMode": 0o666})
		if l := g.gpucrLog(); !strings.Contains(l, "can reach none of this host's 2 NVIDIA GPUs") || !strings.Contains(l, "the restored processes were killed") {
			t.Fatalf("gpucr's log of a restore into a container without a GPU:\n%s", l)
		}
		if strings.Contains(g.driverCalls(), "restore ") {
			t.Errorf("the driver was asked to restore:\n%s", g.driverCalls())
		}
		before := count(t, g.bundle)
		time.Sleep(300 * time.Millisecond)
		if now := count(t, g.bundle); now != before {
			t.Errorf("the restored container counts on (%d -> %d) without its GPU state", before, now)
		}
	})
}

// restore --container plans the GPUs as the integration does, onto those the restored
// container can reach: given GPU 1, GPU 0's state goes there; given none, the restore is
// refused, the container removed and the image unchanged. It restored the GPU state onto
// the host's GPUs (tester's report).
func TestContainerRestoreOntoItsGPU(t *testing.T) {
	const gpu0, gpu1 = "000102030405060708090a0b0c0d0e0f", "101112131415161718191a1b1c1d1e1f" // fakenvml.c's UUIDs
	for name, dev := range map[string]map[string]any{
		"given GPU 1": {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "fileMode": 0o666},
		"given none":  {"path": "/dev/nvidia0", "type": "b", "major": 195, "minor": 0, "fileMode": 0o666},
	} {
		t.Run(name, func(t *testing.T) {
			runc, _ := needRunc(t)
			drv := newFakeDriver(t)
			bundle := counterBundle(t, runc, "", "-mib", "4") // one process: no child inherits the device
			holdGPUDevice(t, bundle)
			testutil.EditJSON(t, filepath.Join(bundle, "config.json"), func(spec map[string]any) {
				spec["linux"].(map[string]any)["devices"] = []any{dev}
			})
			id := containerID(t, runc, "dev")
			runcRun(t, runc, bundle, id)
			waitContainerCount(t, bundle, 3)
			drv.claim(t, runcInitPID(t, runc, id))
			calls := filepath.Join(t.TempDir(), "cuda.log")
			// The fake's two GPUs differ in model and L2 size: checks switched off as a user would.
			env := append(append([]string(nil), drv.env...), "FAKECUDA_LOG="+calls, "NV_MODEL_CHECK=0", "NV_L2_CHECK=0")
			dir := filepath.Join(t.TempDir(), "img")
			mustGpucrEnv(t, env, "checkpoint", "--container", id, "-D", dir)
			frozen := count(t, bundle)

			out, errOut, code := gpucrEnv(t, env, "restore", "--container", id, "-D", dir)
			driver, _ := os.ReadFile(calls)
			if name == "given GPU 1" {
				if code != 0 || !strings.Contains(string(driver), " "+gpu0+">"+gpu1) {
					t.Fatalf("restore: exit %d: %s%s\nthe driver's calls:\n%s", code, out, errOut, driver)
				}
				checkCountsOn(t, bundle, frozen)
				return
			}
			if code == 0 || !strings.Contains(errOut, "can reach none of this host's 2 NVIDIA GPUs") || !strings.Contains(errOut, "the image is unchanged") {
				t.Errorf("restore into a container without a GPU device: exit %d: %s%s", code, out, errOut)
			}
			if strings.Contains(string(driver), "restore ") {
				t.Errorf("the driver was asked to restore:\n%s", driver)
			}
			if !gone(runc, id) {
				t.Error("the restored container was left")
			}
			mustGpucr(t, "verify", dir)
		})
	}
}

// gpuRoundTrip is a fake-GPU container checkpointed and restored by plain runc with the
// integration, and what its driver and gpucr logged.
type gpuRoundTrip struct {
	bundle                string
	frozen                int
	gpucrLog, driverCalls func() string
}

// integrationGPURoundTrip runs a one-process counter holding a GPU device file, given the
// device node dev (a block device, say, is no GPU), claims it as a fake GPU process on
// GPU 0, and has runc checkpoint it and restore it under a new ID, the fake driver and
// the integration under both.
func integrationGPURoundTrip(t *testing.T, dev map[string]any) gpuRoundTrip {
	t.Helper()
	g := newIntegrationGPU(t, dev)
	g.runc("checkpoint", "--image-path", filepath.Join(g.tmp, "img"), "--work-path", filepath.Join(g.tmp, "work"), g.id)
	frozen := count(t, g.bundle)
	// runc's restore succeeds even where post-resume fails: CRIU has resumed the processes
	// by then and only logs the script's status.
	g.runc("restore", "--detach", "--image-path", filepath.Join(g.tmp, "img"), "--work-path", filepath.Join(g.tmp, "work2"), "--bundle", g.bundle, g.id2)
	return gpuRoundTrip{bundle: g.bundle, frozen: frozen, gpucrLog: g.gpucrLog, driverCalls: g.driverCalls}
}

// integrationGPU is a one-process counter container holding a GPU device file, claimed as
// a fake GPU process on GPU 0, under plain runc with the integration installed.
type integrationGPU struct {
	tmp, bundle, id, id2  string
	pid                   int
	drv                   *fakeDriver
	runc                  func(args ...string) // runc with the fake driver, failing the test on an error
	gpucrLog, driverCalls func() string
}

// newIntegrationGPU starts an integrationGPU whose container is given the device node dev.
func newIntegrationGPU(t *testing.T, dev map[string]any) *integrationGPU {
	t.Helper()
	runc, criuPath := needRunc(t)
	tmp := t.TempDir()
	conf, script, log := filepath.Join(tmp, "runc.conf"), filepath.Join(tmp, "criu-action"), filepath.Join(tmp, "action.log")
	mustGpucr(t, "install-criu-integration", "--config", conf, "--crun-config", "", "--script", script, "--log", log,
		"--state-dir", filepath.Join(tmp, "state"))
	drv := newFakeDriver(t)
	bundle := counterBundle(t, runc, conf, "-mib", "4") // one process: no child inherits the device
	holdGPUDevice(t, bundle)
	testutil.EditJSON(t, filepath.Join(bundle, "config.json"), func(spec map[string]any) {
		spec["linux"].(map[string]any)["devices"] = []any{dev}
	})
	g := &integrationGPU{tmp: tmp, bundle: bundle, id: containerID(t, runc, "g"), id2: containerID(t, runc, "g2"), drv: drv}
	runcRun(t, runc, bundle, g.id)
	waitContainerCount(t, bundle, 3)
	g.pid = runcInitPID(t, runc, g.id)
	drv.claim(t, g.pid)
	calls := filepath.Join(tmp, "cuda.log")
	read := func(path string) func() string { return func() string { b, _ := os.ReadFile(path); return string(b) } }
	g.gpucrLog, g.driverCalls = read(log), read(calls)
	// The fake's two GPUs differ in model and L2 size: those checks would refuse the move,
	// and are switched off as a user would.
	env := append(append([]string(nil), drv.env...), "FAKECUDA_LOG="+calls, "NV_MODEL_CHECK=0", "NV_L2_CHECK=0")
	g.runc = func(args ...string) {
		t.Helper()
		c := hwbreak.Command(runc, append([]string{"--criu", criuPath}, args...)...)
		c.Env = append(c.Env, env...)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("runc %s: %v: %s\ngpucr's log:\n%s", args[0], err, out, g.gpucrLog())
		}
	}
	return g
}

// holdGPUDevice makes the bundle's container hold a device at /dev/nvidiactl (the host's
// /dev/null, bound there) open, as a GPU process holds the driver's.
func holdGPUDevice(t *testing.T, bundle string) {
	t.Helper()
	testutil.EditJSON(t, filepath.Join(bundle, "config.json"), func(spec map[string]any) {
		spec["mounts"] = append(spec["mounts"].([]any), map[string]any{
			"destination": "/dev/nvidiactl", "type": "bind", "source": "/dev/null", "options": []string{"bind"}})
		proc := spec["process"].(map[string]any)
		proc["args"] = append([]any{"sh", "-c", `exec 3</dev/nvidiactl; exec "$@"`, "sh"}, proc["args"].([]any)...)
	})
}

// A container holding 64 MiB: gpucr saves that memory itself while runc's dump leaves the
// container paused (CRIU's page files stay small), and writes it back at restore through
// the action script it hands CRIU, before the container resumes; it counts on with its
// memory intact. A checkpoint that runs out of disk saving it leaves the container running;
// one with --to is stored too, and restore --from streams it.
func TestContainerMemorySavedAndFilledByGpucr(t *testing.T) {
	runc, bundle, id, id2 := counterContainer(t, "m", "-mib", "64")

	// Onto a disk where CRIU's files fit and the 64 MiB do not: refused, nothing left, the
	// container thawed and counting.
	small := smallTmp(t, 24<<20)
	if out, code := gpucr(t, "checkpoint", "--container", id, "-D", filepath.Join(small, "img")); code != exitFailed || !strings.Contains(out, "disk for the image is full") {
		t.Errorf("checkpoint onto a full disk: exit %d: %s", code, out)
	}
	if entries, _ := os.ReadDir(small); len(entries) != 0 {
		t.Errorf("a failed checkpoint left %v", entries)
	}
	waitContainerCount(t, bundle, count(t, bundle)+3)

	dir, storeDir := filepath.Join(t.TempDir(), "img"), t.TempDir()
	var ck checkpointDoc
	initPID := runcInitPID(t, runc, id)
	if err := json.Unmarshal([]byte(mustGpucr(t, "checkpoint", "--json", "--container", id, "-D", dir, "--to", filepath.Join(storeDir, "ckpt"))), &ck); err != nil {
		t.Fatal(err)
	}
	if ck.RootPID != initPID || ck.ContainerPID != 1 {
		t.Errorf("checkpoint says rootPid %d, containerPid %d; want the host's %d and the container's 1", ck.RootPID, ck.ContainerPID, initPID)
	}
	if out := mustGpucr(t, "ls", storeDir); ck.Pushed == nil || !strings.Contains(out, "ckpt") {
		t.Errorf("--to stored %+v; ls:\n%s", ck.Pushed, out)
	}
	saved, _ := filepath.Glob(filepath.Join(dir, "mem", "*.img"))
	if pages := dirSize(t, filepath.Join(dir, "criu"), "pages-"); !hasPhase(ck.Phases, "memory-save") || len(saved) == 0 || pages > 32<<20 {
		t.Errorf("phases %+v: gpucr saved %d files, CRIU's page files hold %d bytes", ck.Phases, len(saved), pages)
	}
	frozen := count(t, bundle)
	mustGpucr(t, "verify", dir)
	var ins inspectDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", dir)), &ins); err != nil {
		t.Fatal(err)
	}
	if ps := ins.CRIU.Processes; len(ps) != 1 || ps[0].MemoryBytes < 64<<20 {
		t.Errorf("inspect counts %+v of the container's memory, want its 64 MiB too", ps)
	}

	var rs restoreDoc
	// Restored from the store it was stored in, its memory streamed from there.
	if err := json.Unmarshal([]byte(mustGpucr(t, "restore", "--json", "--container", id, "--from", filepath.Join(storeDir, "ckpt"), "--new-id", id2)), &rs); err != nil {
		t.Fatal(err)
	}
	if rs.Streamed == nil || rs.Streamed.MemoryBytes < 64<<20 || rs.Streamed.Chunks == 0 {
		t.Errorf("restore --from streamed %+v, want the container's 64 MiB", rs.Streamed)
	}
	if initPID := runcInitPID(t, runc, id2); rs.RootPID != initPID || rs.ContainerPID != 1 {
		t.Errorf("restore says rootPid %d, containerPid %d; want the host's %d and the container's 1", rs.RootPID, rs.ContainerPID, initPID)
	}
	if !hasPhase(rs.Phases, "memory-fill") {
		t.Errorf("restore phases %+v: no memory-fill", rs.Phases)
	}
	checkCountsOn(t, bundle, frozen)
	w := &workload{dir: filepath.Join(bundle, "rootfs")}
	if v := w.verify(t, rs.RootPID); v != "ok" {
		t.Fatalf("memory of the restored container: %s", v)
	}
}

// A container podman manages (as its annotation tells) is refused by checkpoint --container
// and --dry-run with one line giving podman's command, and keeps running, never paused.
func TestEngineOwnedContainerIsRefused(t *testing.T) {
	runc, _ := needRunc(t)
	bundle := counterBundle(t, runc, "")
	testutil.EditJSON(t, filepath.Join(bundle, "config.json"), func(spec map[string]any) {
		spec["annotations"] = map[string]string{"io.container.manager": "libpod"}
	})
	id := containerID(t, runc, "podman-owned")
	runcRun(t, runc, bundle, id)
	n := waitContainerCount(t, bundle, 3)
	dir := filepath.Join(t.TempDir(), "img")
	for _, args := range [][]string{{"checkpoint", "--container", id, "-D", dir}, {"checkpoint", "--container", id, "--dry-run"}} {
		out, errOut, code := gpucrEnv(t, nil, args...)
		if code != 2 || out != "" || !oneLineWith(errOut, "podman container checkpoint "+id) {
			t.Errorf("gpucr %s: exit %d, stdout %q, stderr %q; want exit 2 and podman's command", strings.Join(args, " "), code, out, errOut)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a refused checkpoint left an image")
	}
	waitContainerCount(t, bundle, n+3)
	if out, err := hwbreak.Command(runc, "state", id).Output(); err != nil || !strings.Contains(string(out), `"running"`) {
		t.Errorf("runc state after the refusal: %v\n%s", err, out)
	}
}

// A container whose shell starts a short-lived process every few milliseconds checkpoints:
// what was read before the pause and exited since is not part of the image.
func TestContainerWithShortLivedChildrenCheckpoints(t *testing.T) {
	runc, _ := needRunc(t)
	bundle := counterBundle(t, runc, "")
	cfg := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte("sleep 0.1"), []byte("sleep 0.002; sleep 0.002"), 1)
	if err := os.WriteFile(cfg, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	id := containerID(t, runc, "churn")
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 3)
	for i := range 5 {
		mustGpucr(t, "checkpoint", "--container", id, "--leave-running", "-D", filepath.Join(t.TempDir(), fmt.Sprint("img", i)))
	}
}

// counterContainer runs the test counter (with args) in a new container, once it counts, and
// returns runc, the bundle, the container's ID and a second ID to restore it as.
func counterContainer(t *testing.T, name string, args ...string) (runc, bundle, id, id2 string) {
	t.Helper()
	runc, _ = needRunc(t)
	bundle = counterBundle(t, runc, "", args...)
	id, id2 = containerID(t, runc, name), containerID(t, runc, name+"2")
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 5)
	return runc, bundle, id, id2
}

// runcInitPID is the host's PID of container id's init, as runc knows it.
func runcInitPID(t *testing.T, runc, id string) int {
	t.Helper()
	out, err := hwbreak.Command(runc, "state", id).Output()
	var st struct {
		PID int `json:"pid"`
	}
	if err == nil {
		err = json.Unmarshal(out, &st)
	}
	if err != nil || st.PID <= 0 {
		t.Fatalf("runc state %s: %v: %s", id, err, out)
	}
	return st.PID
}

// A container streamed to a store with --to alone: its 64 MiB never touch local disk (TMPDIR
// is a 4 MiB filesystem); restore --from brings it back counting, memory intact.
func TestContainerStreamedToAStore(t *testing.T) {
	runc, bundle, id, id2 := counterContainer(t, "s", "-mib", "64")

	loc := filepath.Join(t.TempDir(), "store", "ckpt")
	env := []string{"TMPDIR=" + smallTmp(t, 4<<20)}
	var ck checkpointDoc
	if err := json.Unmarshal([]byte(mustGpucrEnv(t, env, "checkpoint", "--json", "--container", id, "--to", loc)), &ck); err != nil {
		t.Fatal(err)
	}
	if !ck.Streamed || ck.Pushed == nil || ck.MemoryBytes < 64<<20 || !hasPhase(ck.Phases, "memory-save") {
		t.Fatalf("streamed container checkpoint: %+v", ck)
	}
	if !gone(runc, id) {
		t.Fatal("the container still exists after a streamed checkpoint without --leave-running")
	}
	frozen := count(t, bundle)

	var rs restoreDoc
	pulled := filepath.Join(t.TempDir(), "pulled")
	if err := json.Unmarshal([]byte(mustGpucr(t, "restore", "--json", "--container", id, "--from", loc, "-D", pulled, "--new-id", id2)), &rs); err != nil {
		t.Fatal(err)
	}
	checkCountsOn(t, bundle, frozen)
	w := &workload{dir: filepath.Join(bundle, "rootfs")}
	if v := w.verify(t, rs.RootPID); v != "ok" {
		t.Fatalf("memory of the container restored from the stream: %s", v)
	}
}

// A store that fails while the container's memory streams: one line naming it, the
// container thawed and counting, nothing listed in the store.
func TestContainerStreamFailingKeepsItRunning(t *testing.T) {
	_, bundle, id, _ := counterContainer(t, "f", "-mib", "16")
	storeDir := t.TempDir()
	// A file where the chunks directory goes: every chunk upload fails.
	if err := os.WriteFile(filepath.Join(storeDir, "chunks"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := gpucrEnv(t, nil, "checkpoint", "--container", id, "--to", filepath.Join(storeDir, "ckpt"))
	if code != 1 || out != "" || strings.Count(withoutProgress(errOut), "\n") != 1 || !strings.Contains(errOut, "chunks") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and one line naming the chunks", code, out, errOut)
	}
	waitContainerCount(t, bundle, count(t, bundle)+3)
	if out, _, code := gpucrEnv(t, nil, "ls", storeDir); code != 0 || strings.Contains(out, "ckpt") {
		t.Errorf("ls after a failed stream (exit %d):\n%s", code, out)
	}
}

// A container made under the restore's ID by someone else while the restore runs is theirs:
// the failed restore says so and leaves it running (a hostile test had gpucr delete it,
// taking it for the half-restored one). The other container is started by a runc wrapper
// just before it runs the real `runc restore`.
func TestRestoreLeavesAContainerMadeMeanwhile(t *testing.T) {
	runc, bundle, id, id2 := counterContainer(t, "race")
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", "--container", id, "-D", dir)
	other := counterBundle(t, runc, "")
	wrapper := filepath.Join(t.TempDir(), "runc")
	script := fmt.Sprintf("#!/bin/sh\ncase \" $* \" in *\" restore \"*) %s run --detach --bundle %s %s </dev/null >/dev/null 2>&1 ;; esac\nexec %s \"$@\"\n",
		runc, other, id2, runc)
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	out, code := gpucr(t, "restore", "--container", id, "-D", dir, "--new-id", id2, "--runc", wrapper)
	if code == 0 || !oneLineWith(out, "--new-id") {
		t.Fatalf("restore under an ID taken meanwhile: exit %d, want one line saying what to do:\n%s", code, out)
	}
	if gone(runc, id2) {
		t.Fatal("the failed restore removed the container another had made under its ID")
	}
	waitContainerCount(t, other, count(t, other)+2)
	if n := count(t, bundle); n == 0 {
		t.Fatal("the checkpointed container's counter is gone")
	}
}

// A restore's record names the container it was making; a container under that ID made
// before the restore's runtime started is another's, and recover leaves it running.
func TestRecoverLeavesAContainerOlderThanTheRestore(t *testing.T) {
	runc, bundle, id, _ := counterContainer(t, "older")
	host := newCrashHost(t)
	if err := os.MkdirAll(filepath.Join(host.run, "txn"), 0o700); err != nil {
		t.Fatal(err)
	}
	rec := txn.Record{ID: "restore-0123456789ab", Op: txn.OpRestore, Target: "container " + id,
		Owner: txn.Proc{PID: 999999, Start: 1}, Phase: "criu-restore",
		Container: &txn.Container{ID: id, Runtime: []string{runc}, StateDir: filepath.Join("/run/runc", id), Bundle: bundle, Since: time.Now()}}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(host.run, "txn", rec.ID+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustGpucr(t, append([]string{"recover"}, host.flags()...)...); !strings.Contains(out, "rolled back the restore") {
		t.Errorf("recover said: %s", out)
	}
	if gone(runc, id) {
		t.Fatal("recover removed a container made before the restore it rolled back")
	}
	waitContainerCount(t, bundle, count(t, bundle)+2)
	host.checkClean(t)
}

// runc's image path defaults to ./checkpoint, and podman keeps a checkpoint's directory: a
// dump into an image directory that holds an earlier dump's GPU record checkpoints its own
// GPUs. A hostile test's second dump took the first's record for its own, skipped the
// driver's lock and checkpoint, and the container was removed with its GPU state nowhere.
func TestIntegrationDumpsIntoAReusedImagePath(t *testing.T) {
	g := newIntegrationGPU(t, map[string]any{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666})
	img := filepath.Join(g.tmp, "checkpoint")
	g.runc("checkpoint", "--leave-running", "--image-path", img, "--work-path", filepath.Join(g.tmp, "work1"), g.id)
	deadline := time.Now().Add(10 * time.Second) // the rollback watcher resumes the GPU once CRIU is done
	for g.drv.state(g.pid) != "0" && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	g.runc("checkpoint", "--image-path", img, "--work-path", filepath.Join(g.tmp, "work2"), g.id)
	if n := strings.Count(g.driverCalls(), fmt.Sprintf("checkpoint %d\n", g.pid)); n != 2 {
		t.Fatalf("the driver checkpointed the container %d times in two dumps, want 2; its calls:\n%s\ngpucr's log:\n%s", n, g.driverCalls(), g.gpucrLog())
	}
	g.runc("restore", "--detach", "--image-path", img, "--work-path", filepath.Join(g.tmp, "work3"), "--bundle", g.bundle, g.id2)
	if !strings.Contains(g.gpucrLog(), "GPU state restored") {
		t.Fatalf("the integration did not restore the GPU state; its log:\n%s", g.gpucrLog())
	}
}

// A container runc does not have is a wrong request (exit 2, as a PID with no process),
// named as such: it exited 1 with runc's words alone (hostile test).
func TestCheckpointOfNoSuchContainerIsAUsageError(t *testing.T) {
	needRunc(t)
	out, code := gpucr(t, "checkpoint", "--container", "gpucr-e2e-no-such-container", "-D", filepath.Join(t.TempDir(), "img"))
	if code != exitUsage || !oneLineWith(out, "no such container: gpucr-e2e-no-such-container") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// runc opens its --log file by name, following symlinks: in a TMPDIR another user owned,
// the user renamed root's runc log away and put a symlink in its place, and root's runc
// created or appended to a file of their choosing (review). The container verbs refuse such
// a TMPDIR before runc runs, and the container runs on.
func TestContainerVerbsRefuseATempDirOthersCanChange(t *testing.T) {
	runc, _ := needRunc(t)
	bundle := counterBundle(t, runc, "")
	id := containerID(t, runc, "tmpdir")
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 3)
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", "--container", id, "-D", img, "--leave-running")
	for _, args := range [][]string{
		{"checkpoint", "--container", id, "-D", filepath.Join(t.TempDir(), "img")},
		{"restore", "--container", id, "-D", img, "--new-id", id + "-new"},
	} {
		out, errOut, code := gpucrEnv(t, []string{"TMPDIR=" + theirs}, args...)
		if code == 0 || !oneLineWith(errOut, "others could swap what root writes there") {
			t.Errorf("gpucr %s with a TMPDIR another user owns: exit %d\n%s%s", args[0], code, out, errOut)
		}
		if left, _ := os.ReadDir(theirs); len(left) > 0 {
			t.Errorf("gpucr %s made %v in the other user's TMPDIR", args[0], left)
		}
	}
	n := count(t, bundle)
	waitContainerCount(t, bundle, n+2)
}

// A container in the host's PID namespace restored under --new-id while the one it was
// checkpointed from runs on needs PIDs that one holds: CRIU failed to fork there, and runc's
// cleanup of the half-restored container, which has no PID namespace of its own, killed
// every process of the cgroup both share (their bundle's cgroupsPath): the running
// original (hostile test). The restore is refused up front, in one line naming the PID,
// and the original counts on.
func TestContainerRestoreInTheHostPIDNamespaceSparesItsOriginal(t *testing.T) {
	runc, _ := needRunc(t)
	bundle := counterBundle(t, runc, "")
	id, id2 := containerID(t, runc, "hostpid"), containerID(t, runc, "hostpid2")
	testutil.EditJSON(t, filepath.Join(bundle, "config.json"), func(spec map[string]any) {
		linux := spec["linux"].(map[string]any)
		var ns []any
		for _, n := range linux["namespaces"].([]any) {
			if n.(map[string]any)["type"] != "pid" {
				ns = append(ns, n)
			}
		}
		linux["namespaces"] = ns
		linux["cgroupsPath"] = "/" + id
	})
	runcRun(t, runc, bundle, id)
	waitContainerCount(t, bundle, 5)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", "--container", id, "--leave-running", "-D", dir)

	out, code := gpucr(t, "restore", "--container", id, "-D", dir, "--new-id", id2)
	if code == 0 || !oneLineWith(out, "is in use") {
		t.Errorf("restore onto PIDs the running original holds: exit %d, want one line naming the PID:\n%s", code, out)
	}
	if gone(runc, id) {
		t.Fatal("the failed restore killed the container it was checkpointed from")
	}
	waitContainerCount(t, bundle, count(t, bundle)+3)
}

// execdOutsideInit waits, at most 10 s, for a process named comm in container id's cgroup
// that is not below its init, as runc exec --detach leaves one: runc returns before its
// init has exec'd the command (under CI's load the test looked while the process was still
// runc's, named otherwise).
func execdOutsideInit(t *testing.T, runc, id, comm string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		tree, err := proctree.Tree(runcInitPID(t, runc, id))
		if err != nil {
			t.Fatal(err)
		}
		below := map[int]bool{}
		for _, p := range tree {
			below[p.PID] = true
		}
		for _, pid := range inCgroupOf(id) {
			if !below[pid] && commOf(pid) == comm {
				return pid
			}
		}
	}
	t.Fatalf("no %s outside container %s's init's tree", comm, id)
	return 0
}

// A process started in a container with runc exec -d is in its cgroup and PID namespace but
// not below its init (its parent was runc's, on the host): CRIU dumps the init's tree only,
// so a checkpoint said it had saved the container, two processes, and its removal killed
// the exec'd one unsaved (hostile test). The checkpoint is refused in one line naming it,
// exit 2, and both run on.
func TestContainerWithAnExecdProcessIsRefused(t *testing.T) {
	runc, bundle, id, _ := counterContainer(t, "exec")
	mustRunc(t, runc, "exec", "--detach", id, "sleep", "1000")
	execd := execdOutsideInit(t, runc, id, "sleep")
	// Gone before the container's removal: its parent is this test (a subreaper), and runc's
	// delete waited for good on an init that waited for it to be reaped.
	t.Cleanup(func() {
		_ = syscall.Kill(execd, syscall.SIGKILL)
		testutil.Reap()
	})
	out, code := gpucr(t, "checkpoint", "--container", id, "-D", filepath.Join(t.TempDir(), "img"))
	if code != 2 || !oneLineWith(out, fmt.Sprintf("PID %d (sleep)", execd)) {
		t.Fatalf("checkpoint of a container with an exec'd process: exit %d, want 2 and one line naming it:\n%s", code, out)
	}
	if gone(runc, id) || syscall.Kill(execd, 0) != nil {
		t.Fatal("the container or its exec'd process is gone after a refused checkpoint")
	}
	waitContainerCount(t, bundle, count(t, bundle)+3)
}
