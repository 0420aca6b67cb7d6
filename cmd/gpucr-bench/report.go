package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"slices"
	"sort"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Summary is the median of one workload's runs by both methods, and their ratio.
type Summary struct {
	Workload        string             `json:"workload"`
	Images          string             `json:"images"`
	Runs            int                `json:"runsPerMethod"`
	GPUBytes        int64              `json:"gpuBytes"`
	BaselineCkpt    float64            `json:"baselineCheckpointSeconds"`
	GpucrCkpt       float64            `json:"gpucrCheckpointSeconds"`
	BaselineRestore float64            `json:"baselineRestoreSeconds"`
	GpucrRestore    float64            `json:"gpucrRestoreSeconds"`
	CkptRatio       float64            `json:"checkpointRatio"` // gpucr / baseline
	RestoreRatio    float64            `json:"restoreRatio"`
	BaselinePhases  map[string]float64 `json:"baselinePhases"`
	GpucrPhases     map[string]float64 `json:"gpucrPhases"`
	ImageBytes      int64              `json:"gpucrImageBytes"`
	BaselineImage   int64              `json:"baselineImageBytes"`
	AllRunsVerified bool               `json:"allRunsVerified"`
	// Variants are gpucr run another way (-compare-criu-pages, -compare-signed), by method.
	Variants map[string]Variant `json:"variants,omitempty"`
}

// Variant is the median of one workload's runs by gpucr run another way.
type Variant struct {
	Ckpt    float64            `json:"checkpointSeconds"`
	Restore float64            `json:"restoreSeconds"`
	Phases  map[string]float64 `json:"phases"`
}

func summarize(runs []Run) []Summary {
	// One summary per workload and image directory, in the order they ran.
	type key struct{ workload, images string }
	var order []key
	by := map[key][]Run{}
	for _, r := range runs {
		k := key{r.Workload, r.Images}
		if _, ok := by[k]; !ok {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	var out []Summary
	for _, w := range order {
		s := Summary{Workload: w.workload, Images: w.images, AllRunsVerified: true}
		pick := func(method string, f func(Run) float64) float64 {
			var xs []float64
			for _, r := range by[w] {
				if r.Method == method {
					xs = append(xs, f(r))
				}
			}
			return median(xs)
		}
		phases := func(method string) map[string]float64 {
			names := map[string]bool{}
			for _, r := range by[w] {
				if r.Method == method {
					for n := range r.Phases {
						names[n] = true
					}
				}
			}
			m := map[string]float64{}
			for n := range names {
				m[n] = pick(method, func(r Run) float64 { return r.Phases[n] })
			}
			return m
		}
		for _, r := range by[w] {
			s.AllRunsVerified = s.AllRunsVerified && r.Verified
			if r.Method == methodGpucr {
				s.Runs++
				s.ImageBytes = r.ImageBytes
			}
			if r.Method == methodBaseline {
				s.BaselineImage = r.ImageBytes
			}
			s.GPUBytes = max(s.GPUBytes, r.GPUBytes)
		}
		s.BaselineCkpt = pick(methodBaseline, func(r Run) float64 { return r.Checkpoint })
		s.GpucrCkpt = pick(methodGpucr, func(r Run) float64 { return r.Checkpoint })
		s.BaselineRestore = pick(methodBaseline, func(r Run) float64 { return r.Restore })
		s.GpucrRestore = pick(methodGpucr, func(r Run) float64 { return r.Restore })
		s.CkptRatio = ratio(s.GpucrCkpt, s.BaselineCkpt)
		s.RestoreRatio = ratio(s.GpucrRestore, s.BaselineRestore)
		s.BaselinePhases, s.GpucrPhases = phases(methodBaseline), phases(methodGpucr)
		for _, m := range variants {
			if !slices.ContainsFunc(by[w], func(r Run) bool { return r.Method == m }) {
				continue
			}
			if s.Variants == nil {
				s.Variants = map[string]Variant{}
			}
			s.Variants[m] = Variant{
				Ckpt:    pick(m, func(r Run) float64 { return r.Checkpoint }),
				Restore: pick(m, func(r Run) float64 { return r.Restore }),
				Phases:  phases(m),
			}
		}
		out = append(out, s)
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	sort.Float64s(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func markdown(ss []Summary) string {
	var b strings.Builder
	b.WriteString("| workload | images in | GPU memory | runs | checkpoint baseline | checkpoint gpucr | ratio | restore baseline | restore gpucr | ratio | verified |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range ss {
		fmt.Fprintf(&b, "| %s | %s | %.1f GiB | %d | %.2f s | %.2f s | %.2f | %.2f s | %.2f s | %.2f | %v |\n", s.Workload, s.Images,
			float64(s.GPUBytes)/(1<<30), s.Runs, s.BaselineCkpt, s.GpucrCkpt, s.CkptRatio, s.BaselineRestore, s.GpucrRestore, s.RestoreRatio, s.AllRunsVerified)
	}
	b.WriteString("\nThroughput (GPU memory moved per second of median wall time) and image size:\n\n")
	b.WriteString("| workload | images in | checkpoint baseline | checkpoint gpucr | restore baseline | restore gpucr | image baseline | image gpucr |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range ss {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.1f GiB | %.1f GiB |\n", s.Workload, s.Images,
			rate(s.GPUBytes, s.BaselineCkpt), rate(s.GPUBytes, s.GpucrCkpt), rate(s.GPUBytes, s.BaselineRestore), rate(s.GPUBytes, s.GpucrRestore),
			float64(s.BaselineImage)/(1<<30), float64(s.ImageBytes)/(1<<30))
	}
	b.WriteString("\nMedian phase times (s):\n\n")
	for _, s := range ss {
		fmt.Fprintf(&b, "- %s in %s: baseline %s; gpucr %s\n", s.Workload, s.Images, phaseList(s.BaselinePhases), phaseList(s.GpucrPhases))
	}
	for _, s := range ss {
		for _, m := range variants {
			if v, ok := s.Variants[m]; ok {
				fmt.Fprintf(&b, "- %s in %s, gpucr %s: checkpoint %.2f s (%.2f of baseline, %.2f of gpucr), restore %.2f s (%.2f of baseline, %.2f of gpucr); %s\n",
					s.Workload, s.Images, variantNames[m], v.Ckpt, ratio(v.Ckpt, s.BaselineCkpt), ratio(v.Ckpt, s.GpucrCkpt),
					v.Restore, ratio(v.Restore, s.BaselineRestore), ratio(v.Restore, s.GpucrRestore), phaseList(v.Phases))
			}
		}
	}
	return b.String()
}

// rate is bytes per second in GB/s, for the markdown table.
func rate(bytes int64, seconds float64) string {
	if seconds == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f GB/s", float64(bytes)/seconds/1e9)
}

func phaseList(m map[string]float64) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.2f", n, m[n])
	}
	return strings.Join(parts, ", ")
}

// chart draws, per workload, four bars: checkpoint and restore, baseline and gpucr; and,
// where a run held two or more sizes in one image directory, how each of the four grows
// with the GPU memory held: the cost of size is a slope there, not a row of bars.
func chart(path string, ss []Summary) error {
	const barW, gap, groupGap, plotH, top, left = 18, 4, 40, 300, 30, 50
	series := growth(ss)
	width := max(left+len(ss)*(4*(barW+gap)+groupGap)+20, 7*len(barsTitle)+2*left)
	height := top + plotH + 86
	if series != nil {
		height += growthH
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	maxV := 1.0
	for _, s := range ss {
		maxV = max(maxV, s.BaselineCkpt, s.GpucrCkpt, s.BaselineRestore, s.GpucrRestore)
	}
	label(img, left, 18, fmt.Sprintf(barsTitle, maxV))
	for i, s := range ss {
		x := left + i*(4*(barW+gap)+groupGap)
		for j, v := range times(s) {
			h := int(v / maxV * plotH)
			r := image.Rect(x+j*(barW+gap), top+plotH-h, x+j*(barW+gap)+barW, top+plotH)
			draw.Draw(img, r, &image.Uniform{seriesColors[j]}, image.Point{}, draw.Src)
		}
		label(img, x, top+plotH+16, s.Workload)
		label(img, x, top+plotH+32, s.Images)
		label(img, x, top+plotH+48, fmt.Sprintf("x%.2f / x%.2f", s.CkptRatio, s.RestoreRatio))
	}
	if series != nil {
		drawGrowth(img, image.Rect(left, top+plotH+86+30, width-20, height-40), series)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

const (
	barsTitle = "seconds (max %.1f): ckpt baseline, ckpt gpucr, restore baseline, restore gpucr"
	growthH   = 330
)

// seriesColors are the four times' colors, in times' order, in both panels.
var seriesColors = []color.RGBA{{150, 150, 150, 255}, {30, 110, 200, 255}, {200, 200, 200, 255}, {100, 170, 240, 255}}

// times are a summary's four medians in the chart's order.
func times(s Summary) []float64 {
	return []float64{s.BaselineCkpt, s.GpucrCkpt, s.BaselineRestore, s.GpucrRestore}
}

// growth picks the holder workloads of the image directory with the most sizes, smallest
// first; nil if no directory has two.
func growth(ss []Summary) []Summary {
	by := map[string][]Summary{}
	var best string
	for _, s := range ss {
		if !strings.HasPrefix(s.Workload, "holder-") || s.GPUBytes <= 0 {
			continue
		}
		by[s.Images] = append(by[s.Images], s)
		if len(by[s.Images]) > len(by[best]) {
			best = s.Images
		}
	}
	if len(by[best]) < 2 {
		return nil
	}
	out := by[best]
	slices.SortFunc(out, func(a, b Summary) int { return int(a.GPUBytes - b.GPUBytes) })
	return out
}

// drawGrowth plots the four times of series (one image directory, by size) against the
// GPU memory held, in r: a line per time, a dot per run size.
func drawGrowth(img *image.RGBA, r image.Rectangle, series []Summary) {
	maxX := float64(series[len(series)-1].GPUBytes) / (1 << 30)
	maxY := 1.0
	for _, s := range series {
		maxY = max(maxY, slices.Max(times(s)))
	}
	label(img, r.Min.X, r.Min.Y-12, fmt.Sprintf("seconds (max %.1f) by GiB of GPU memory held, images in %s", maxY, series[0].Images))
	at := func(gib, sec float64) image.Point {
		return image.Pt(r.Min.X+int(gib/maxX*float64(r.Dx())), r.Max.Y-int(sec/maxY*float64(r.Dy())))
	}
	axis := color.RGBA{0, 0, 0, 255}
	line(img, at(0, 0), at(maxX, 0), axis)
	line(img, at(0, 0), at(0, maxY), axis)
	for _, s := range series {
		gib := float64(s.GPUBytes) / (1 << 30)
		p := at(gib, 0)
		label(img, p.X-14, p.Y+16, fmt.Sprintf("%.1f", gib))
	}
	for j, c := range seriesColors {
		var prev image.Point
		for i, s := range series {
			p := at(float64(s.GPUBytes)/(1<<30), times(s)[j])
			draw.Draw(img, image.Rect(p.X-3, p.Y-3, p.X+4, p.Y+4), &image.Uniform{c}, image.Point{}, draw.Src)
			if i > 0 {
				line(img, prev, p, c)
			}
			prev = p
		}
	}
}

// line draws a two-pixel-wide straight line from a to b.
func line(img *image.RGBA, a, b image.Point, c color.RGBA) {
	n := max(abs(b.X-a.X), abs(b.Y-a.Y), 1)
	for i := 0; i <= n; i++ {
		x, y := a.X+(b.X-a.X)*i/n, a.Y+(b.Y-a.Y)*i/n
		img.SetRGBA(x, y, c)
		img.SetRGBA(x+1, y, c)
		img.SetRGBA(x, y+1, c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func label(img draw.Image, x, y int, s string) {
	d := &font.Drawer{Dst: img, Src: image.Black, Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}
