package main

import (
	"encoding/json"
	"fmt"
	"image/color"
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

func TestChartPlotsGrowthWithSize(t *testing.T) {
	var runs []Run
	for _, gib := range []int64{64, 16, 32} {
		w := fmt.Sprintf("holder-%dGiB", gib)
		runs = append(runs,
			Run{Workload: w, Images: "/dev/shm/b", Method: "baseline", Rep: 1, Checkpoint: float64(gib), Restore: float64(gib) / 2, GPUBytes: gib << 30, Verified: true},
			Run{Workload: w, Images: "/dev/shm/b", Method: "gpucr", Rep: 1, Checkpoint: float64(gib) / 3, Restore: float64(gib) / 4, GPUBytes: gib << 30, Verified: true})
	}
	// One size elsewhere and the model make no line of their own.
	runs = append(runs, Run{Workload: "holder-16GiB", Images: "/var/tmp/b", Method: "gpucr", Rep: 1, Checkpoint: 9, GPUBytes: 16 << 30},
		Run{Workload: "llama", Images: "/dev/shm/b", Method: "gpucr", Rep: 1, Checkpoint: 3, GPUBytes: 6 << 30})
	ss := summarize(runs)
	g := growth(ss)
	if len(g) != 3 || g[0].Workload != "holder-16GiB" || g[2].Workload != "holder-64GiB" || g[0].Images != "/dev/shm/b" {
		t.Fatalf("growth = %+v", g)
	}
	if growth(ss[3:]) != nil {
		t.Error("a line drawn from one size")
	}
	dir := t.TempDir()
	b, err := json.Marshal(map[string][]Run{"runs": runs})
	if err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(dir, "results.json")
	if err := os.WriteFile(results, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := rewrite(results, dir); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "chart.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// Below the bars, the growth panel draws gpucr's checkpoint line in its bar's color.
	drawn := false
	for y := 30 + 300 + 86; y < img.Bounds().Max.Y && !drawn; y++ {
		for x := 0; x < img.Bounds().Max.X && !drawn; x++ {
			drawn = img.At(x, y) == color.Color(seriesColors[1])
		}
	}
	if !drawn {
		t.Errorf("chart %v has no growth panel", img.Bounds())
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil || !strings.Contains(string(md), "holder-64GiB") {
		t.Errorf("results.md: %v\n%s", err, md)
	}
	if err := rewrite(filepath.Join(dir, "missing.json"), dir); err == nil {
		t.Error("rewrite of a missing results.json succeeded")
	}
}
