package main

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSummaryTakesMediansAndRatios(t *testing.T) {
	var runs []Run
	for i, v := range []float64{10, 30, 20} {
		runs = append(runs,
			Run{Workload: "w", Method: "baseline", Rep: i + 1, Checkpoint: v, Restore: v / 2, Verified: true, Phases: map[string]float64{"criu-dump": v}, GPUBytes: 10e9, ImageBytes: 11 << 30},
			Run{Workload: "w", Method: "gpucr", Rep: i + 1, Checkpoint: v / 4, Restore: v / 5, Verified: true, ImageBytes: 7})
	}
	runs[5].Verified = false
	// The same workload on disk is a summary of its own.
	runs = append(runs, Run{Workload: "w", Images: "/var/tmp/b", Method: "baseline", Rep: 1, Checkpoint: 40, Verified: true},
		Run{Workload: "w", Images: "/var/tmp/b", Method: "gpucr", Rep: 1, Checkpoint: 30, Verified: true})
	ss := summarize(runs)
	if len(ss) != 2 || ss[1].Images != "/var/tmp/b" || ss[1].CkptRatio != 0.75 || !ss[1].AllRunsVerified {
		t.Fatalf("summaries = %+v", ss)
	}
	ss = ss[:1]
	s := ss[0]
	if s.BaselineCkpt != 20 || s.GpucrCkpt != 5 || math.Abs(s.CkptRatio-0.25) > 1e-9 || math.Abs(s.RestoreRatio-0.4) > 1e-9 {
		t.Errorf("summary = %+v", s)
	}
	if s.AllRunsVerified || s.Runs != 3 || s.BaselinePhases["criu-dump"] != 20 {
		t.Errorf("summary = %+v", s)
	}
	md := markdown(ss)
	// 10 GB in a median 5 s checkpoint; baseline image 11 GiB.
	if !strings.Contains(md, "| w |  |") || !strings.Contains(md, "0.25") || !strings.Contains(md, "2.00 GB/s") || !strings.Contains(md, "| 11.0 GiB |") {
		t.Errorf("markdown:\n%s", md)
	}
	p := filepath.Join(t.TempDir(), "chart.png")
	if err := chart(p, ss); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(p)
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("chart is not a PNG: %v", err)
	}
}
