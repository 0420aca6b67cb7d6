// Command gpucr-bench measures gpucr against what users do without it (the CUDA driver's
// checkpoint API, then plain criu dump; criu restore, then the driver's restore), on the same
// workloads in one run, alternating the two, and checks the workload's data after every
// restore: a fast wrong run fails the benchmark. It runs on the GPU machine, as root.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

func main() {
	if err := bench(); err != nil {
		log.Fatal(err)
	}
}

func bench() error {
	cfg := config{libCUDA: os.Getenv("GPUCR_LIBCUDA")}
	sizes := flag.String("sizes", "1,4,16,32", "GiB held on the GPU by the holder workload, comma-separated")
	flag.IntVar(&cfg.reps, "reps", 3, "repetitions of each workload and method")
	flag.StringVar(&cfg.gpucr, "gpucr", "./gpucr", "gpucr binary")
	flag.StringVar(&cfg.criu, "criu", "./criu/criu", "criu binary for the baseline")
	flag.StringVar(&cfg.scripts, "scripts", ".", "directory of holder.py and model.py")
	images := flag.String("images", "/dev/shm/gpucr-bench,/var/tmp/gpucr-bench", "directories images are written to, comma-separated: every workload runs on each (memory, then disk)")
	flag.BoolVar(&cfg.model, "model", true, "also run the transformer model workload")
	criuPages := flag.Bool("compare-criu-pages", false, "also run gpucr with CRIU moving all pages itself (checkpoint and restore)")
	signed := flag.Bool("compare-signed", false, "also run gpucr signing its images (checkpoint --sign, restore --trust)")
	out := flag.String("out", "bench/results", "directory for results.json, results.md and chart.png")
	redraw := flag.String("redraw", "", "run nothing: write results.md and chart.png into -out again from this results.json")
	flag.Parse()
	if *redraw != "" {
		return rewrite(*redraw, *out)
	}
	cfg.methods = []string{methodBaseline, methodGpucr}
	if *criuPages {
		cfg.methods = append(cfg.methods, methodCRIUWrites)
	}
	if *signed {
		keys, err := os.MkdirTemp("", "gpucr-bench-keys-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(keys)
		cfg.signKey = filepath.Join(keys, "bench")
		if out, err := exec.Command(cfg.gpucr, "keygen", cfg.signKey).CombinedOutput(); err != nil {
			return fmt.Errorf("gpucr keygen: %w: %s", err, out)
		}
		cfg.methods = append(cfg.methods, methodSigned)
	}
	for _, d := range strings.Split(*images, ",") {
		cfg.imageDirs = append(cfg.imageDirs, strings.TrimSpace(d))
	}
	for _, s := range strings.Split(*sizes, ",") {
		gib, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return fmt.Errorf("bad size %q", s)
		}
		cfg.workloads = append(cfg.workloads, holderWorkload(gib))
	}
	if cfg.model {
		cfg.workloads = append(cfg.workloads, modelWorkload())
	}
	// Restored workloads are re-parented to the nearest subreaper: make that us, to reap them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	runs, err := run(cfg)
	if werr := write(*out, runs); werr != nil {
		return werr
	}
	return err
}

// rewrite writes the summaries of the runs in an earlier results.json into dir: a chart
// drawn anew needs no GPU.
func rewrite(results, dir string) error {
	b, err := os.ReadFile(results)
	if err != nil {
		return err
	}
	var r struct {
		Runs []Run `json:"runs"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("read %s: %w", results, err)
	}
	if len(r.Runs) == 0 {
		return fmt.Errorf("%s holds no runs", results)
	}
	return write(dir, r.Runs)
}

// write saves the raw runs and the summaries built from them.
func write(dir string, runs []Run) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(struct {
		Runs    []Run     `json:"runs"`
		Summary []Summary `json:"summary"`
	}{runs, summarize(runs)}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return err
	}
	md := markdown(summarize(runs))
	fmt.Print(md)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	return chart(filepath.Join(dir, "chart.png"), summarize(runs))
}
