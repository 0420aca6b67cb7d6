package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/gpu/nvidia/cuda"
	"github.com/gpucr/gpucr/internal/hwbreak"
)

type config struct {
	reps      int
	gpucr     string
	criu      string
	libCUDA   string // $GPUCR_LIBCUDA, as gpucr reads it: a driver library off the loader's path
	scripts   string
	imageDirs []string
	model     bool
	workloads []workload
	methods   []string
	signKey   string // the private key of methodSigned
}

// The methods: the baseline, gpucr, and its variants: gpucr with CRIU moving all pages
// itself, on checkpoint and restore (checkpoint --criu-writes-pages, restore
// --criu-restores-pages), which measures what gpucr's page server and memory fill win; and
// gpucr signing (checkpoint --sign, restore --trust), which measures what the SHA-256 of
// every byte costs.
const (
	methodBaseline   = "baseline"
	methodGpucr      = "gpucr"
	methodCRIUWrites = "gpucr-criu-pages"
	methodSigned     = "gpucr-signed"
)

// variants are the methods reported beside gpucr, in order, and what each does.
var (
	variants     = []string{methodCRIUWrites, methodSigned}
	variantNames = map[string]string{
		methodCRIUWrites: "with CRIU moving all pages itself",
		methodSigned:     "signing (--sign, restored with --trust)",
	}
)

// workload is a GPU process to checkpoint, started by a script that follows one protocol:
// DIR/ready holds "pid digest" once it is loaded; touching DIR/verify makes it recheck its
// state and write DIR/resultK with "same=True" when nothing changed.
type workload struct {
	Name string
	args []string // script and arguments; DIR is appended
}

func holderWorkload(gib float64) workload {
	return workload{Name: fmt.Sprintf("holder-%gGiB", gib), args: []string{"holder.py", strconv.FormatFloat(gib, 'f', -1, 64)}}
}

func modelWorkload() workload {
	return workload{Name: "llama-shaped-2.6B-bf16-generate", args: []string{"model.py"}}
}

// Run is one checkpoint and restore of one workload by one method.
type Run struct {
	Workload   string             `json:"workload"`
	Images     string             `json:"images"` // the directory the image was written to
	Method     string             `json:"method"` // methodBaseline, methodGpucr or one of variants
	Rep        int                `json:"rep"`
	Checkpoint float64            `json:"checkpointSeconds"`
	Restore    float64            `json:"restoreSeconds"`
	Phases     map[string]float64 `json:"phases"`
	ImageBytes int64              `json:"imageBytes"`
	GPUBytes   int64              `json:"gpuBytes"`
	Verified   bool               `json:"verified"`
}

// run alternates the methods, swapping which goes first each repetition, so that neither
// always meets a warmer page cache or GPU.
func run(cfg config) ([]Run, error) {
	drv, err := cuda.Open(cfg.libCUDA)
	if err != nil {
		return nil, err
	}
	var runs []Run
	for _, dir := range cfg.imageDirs {
		for _, w := range cfg.workloads {
			for rep := 1; rep <= cfg.reps; rep++ {
				// Each repetition starts with the next method, so none always goes first.
				k := (rep - 1) % len(cfg.methods)
				methods := append(slices.Clone(cfg.methods[k:]), cfg.methods[:k]...)
				for _, m := range methods {
					r, err := once(cfg, drv, w, dir, m, rep)
					runs = append(runs, r)
					if err != nil {
						return runs, fmt.Errorf("%s in %s, %s rep %d: %w", w.Name, dir, m, rep, err)
					}
					log.Printf("%s in %s %-8s rep %d: checkpoint %.2fs restore %.2fs image %s verified=%v",
						w.Name, dir, m, rep, r.Checkpoint, r.Restore, humanize.IBytes(uint64(r.ImageBytes)), r.Verified)
				}
			}
		}
	}
	return runs, nil
}

func once(cfg config, drv *cuda.Driver, w workload, imageDir, method string, rep int) (Run, error) {
	r := Run{Workload: w.Name, Images: imageDir, Method: method, Rep: rep, Phases: map[string]float64{}}
	p, err := start(cfg, w)
	if err != nil {
		return r, err
	}
	defer p.kill()
	r.GPUBytes = gpuBytes(p.pid)
	img := filepath.Join(imageDir, "img")
	if err := os.RemoveAll(imageDir); err != nil {
		return r, err
	}
	if err := os.MkdirAll(imageDir, 0o755); err != nil {
		return r, err
	}
	defer os.RemoveAll(imageDir)

	switch method {
	case methodBaseline:
		err = baseline(cfg, drv, p.pid, img, &r)
	case methodCRIUWrites:
		err = viaGpucr(cfg, p.pid, img, &r, "--criu-writes-pages", "--criu-restores-pages")
	case methodSigned:
		err = viaGpucr(cfg, p.pid, img, &r, "--sign="+cfg.signKey, "--trust="+cfg.signKey+".pub")
	default:
		err = viaGpucr(cfg, p.pid, img, &r, "", "")
	}
	if err != nil {
		return r, err
	}
	verdict, err := p.verify()
	if err != nil {
		return r, err
	}
	if r.Verified = strings.Contains(verdict, "same=True"); !r.Verified {
		return r, fmt.Errorf("the restored workload's data differs: %s", strings.TrimSpace(verdict))
	}
	return r, nil
}

// baseline is the sequence the issue describes: driver lock + checkpoint, criu dump;
// criu restore, driver restore + unlock.
func baseline(cfg config, drv *cuda.Driver, pid int, img string, r *Run) error {
	if err := os.MkdirAll(img, 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	if err := drv.Lock(pid, 10*time.Second); err != nil {
		return err
	}
	if err := drv.Checkpoint(pid); err != nil {
		return err
	}
	r.Phases["driver-checkpoint"] = time.Since(t0).Seconds()
	t1 := time.Now()
	if out, err := hwbreak.Command(cfg.criu, "dump", "-t", strconv.Itoa(pid), "-D", img, "-v1", "-o", "dump.log").CombinedOutput(); err != nil {
		return fmt.Errorf("criu dump: %v: %s", err, out)
	}
	r.Phases["criu-dump"] = time.Since(t1).Seconds()
	r.Checkpoint = time.Since(t0).Seconds()
	ds, err := criuimg.ReadDumpStats(img)
	if err != nil {
		return err
	}
	addDumpStats(r, ds)
	r.ImageBytes = dirBytes(img)
	waitGone(pid)

	t2 := time.Now()
	if out, err := hwbreak.Command(cfg.criu, "restore", "-D", img, "-d", "-v1", "-o", "restore.log").CombinedOutput(); err != nil {
		return fmt.Errorf("criu restore: %v: %s", err, out)
	}
	r.Phases["criu-restore"] = time.Since(t2).Seconds()
	t3 := time.Now()
	if err := drv.Restore(pid, nil); err != nil {
		return err
	}
	if err := drv.Unlock(pid); err != nil {
		return err
	}
	r.Phases["driver-restore"] = time.Since(t3).Seconds()
	r.Restore = time.Since(t2).Seconds()
	rs, err := criuimg.ReadRestoreStats(img)
	if err != nil {
		return err
	}
	addRestoreStats(r, rs)
	return nil
}

// addDumpStats records where CRIU's dump time went, as CRIU measured it.
func addDumpStats(r *Run, s *criuimg.DumpStats) {
	if s != nil {
		r.Phases["criu:memdump"], r.Phases["criu:memwrite"] = s.MemDump.Seconds(), s.MemWrite.Seconds()
	}
}

// addRestoreStats records where CRIU's restore time went, as CRIU measured it.
func addRestoreStats(r *Run, s *criuimg.RestoreStats) {
	if s != nil {
		r.Phases["criu:forking"], r.Phases["criu:restore"] = s.Forking.Seconds(), s.Restore.Seconds()
	}
}

// viaGpucr checkpoints and restores with gpucr, with the flag ckFlag added to the checkpoint
// and rsFlag to the restore (when not empty).
func viaGpucr(cfg config, pid int, img string, r *Run, ckFlag, rsFlag string) error {
	var ck, rs struct {
		Phases []struct {
			Name    string  `json:"name"`
			Seconds float64 `json:"seconds"`
		} `json:"phases"`
		DumpStats    *criuimg.DumpStats    `json:"criuDumpStats"`
		RestoreStats *criuimg.RestoreStats `json:"criuRestoreStats"`
	}
	ckArgs := []string{"checkpoint", strconv.Itoa(pid), "-D", img, "--json", "--criu", cfg.criu}
	rsArgs := []string{"restore", "-D", img, "--json", "--criu", cfg.criu}
	if ckFlag != "" {
		ckArgs, rsArgs = append(ckArgs, ckFlag), append(rsArgs, rsFlag)
	}
	t0 := time.Now()
	if err := runJSON(&ck, cfg.gpucr, ckArgs...); err != nil {
		return err
	}
	r.Checkpoint = time.Since(t0).Seconds()
	r.ImageBytes = dirBytes(img)
	t1 := time.Now()
	if err := runJSON(&rs, cfg.gpucr, rsArgs...); err != nil {
		return err
	}
	r.Restore = time.Since(t1).Seconds()
	for _, p := range append(ck.Phases, rs.Phases...) {
		r.Phases[p.Name] = p.Seconds
	}
	addDumpStats(r, ck.DumpStats)
	addRestoreStats(r, rs.RestoreStats)
	return nil
}

func runJSON(v any, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, args[0], err, stderr.String())
	}
	return json.Unmarshal(out, v)
}

// proc is a started workload.
type proc struct {
	pid int
	dir string
	cmd *exec.Cmd
}

func start(cfg config, w workload) (*proc, error) {
	dir, err := os.MkdirTemp("", "gpucr-bench-wl-")
	if err != nil {
		return nil, err
	}
	args := append(append([]string{filepath.Join(cfg.scripts, w.args[0])}, w.args[1:]...), dir)
	cmd := exec.Command("python3", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cmd.Stderr, err = os.Create(filepath.Join(dir, "stderr")); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go cmd.Wait() //nolint:errcheck // reaps the original when it is checkpointed away
	p := &proc{pid: cmd.Process.Pid, dir: dir, cmd: cmd}
	if err := waitFile(filepath.Join(dir, "ready"), 5*time.Minute); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "stderr"))
		p.kill()
		return nil, fmt.Errorf("%s did not start: %v: %s", w.Name, err, b)
	}
	return p, nil
}

// verify asks the restored workload to recheck itself and returns its verdict line.
func (p *proc) verify() (string, error) {
	res := filepath.Join(p.dir, "result1")
	if err := os.WriteFile(filepath.Join(p.dir, "verify"), nil, 0o644); err != nil {
		return "", err
	}
	// The workload creates the file, then writes its line: a verdict is whole once it ends
	// in a newline (read too early, an empty file once failed a correct restore).
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(res); err == nil && strings.HasSuffix(string(b), "\n") {
			return string(b), nil
		}
	}
	return "", fmt.Errorf("no verdict from the restored workload in %s", res)
}

func (p *proc) kill() {
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	waitGone(p.pid)
	os.RemoveAll(p.dir)
}

func waitFile(path string, limit time.Duration) error {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s did not appear within %s", path, limit)
}

// waitGone reaps what it can and waits until pid no longer runs.
func waitGone(pid int) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for {
			if p, _ := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); p <= 0 {
				break
			}
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
	}
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error { //nolint:errcheck // a size estimate
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// gpuBytes is the GPU memory pid uses, as nvidia-smi reports it (0 if unknown).
func gpuBytes(pid int) int64 {
	out, err := exec.Command("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, ",")
		if len(f) == 2 && strings.TrimSpace(f[0]) == strconv.Itoa(pid) {
			mib, _ := strconv.ParseInt(strings.TrimSpace(f[1]), 10, 64)
			return mib << 20
		}
	}
	return 0
}
