package nvidia

import (
	"github.com/gpucr/gpucr/internal/gpu"
	"strconv"
	"strings"
	"testing"
)

// --gpu-map is typed by a user and names GPUs an image describes. ParseGPUMap returns an
// error that names the flag, or exactly the pairs given: each image GPU once, each onto its
// own host GPU, by index or UUID. A map it accepts is one PlanMapping follows.
func FuzzParseGPUMap(f *testing.F) {
	for _, s := range []string{"", "  ", "0=1,1=0", "0=2", "GPU-a=GPU-y", "1=GPU-a, GPU-a = 0", "2=0", "0=3",
		"GPU-x=0", "0=GPU-b", "0=1,1=1", "0=1,GPU-a=2", "0:1", "0=1,", "=", ",,", "0==1", " 0 = 1 ", "-1=0", "00=1", "+0=1"} {
		f.Add(s)
	}
	img := image([]string{"GPU-a", "GPU-b", "GPU-c"}, h100(0, "GPU-a", 0), h100(1, "GPU-b", 0), h100(2, "GPU-c", 1))
	here := host(h100(0, "GPU-x", 0), h100(1, "GPU-y", 0), h100(2, "GPU-a", 1))
	// resolve finds the device ref names as the flag's documentation says: by UUID or index.
	resolve := func(h gpu.Host, ref string) (string, bool) {
		ref = strings.TrimSpace(ref)
		for _, d := range h.Devices {
			if d.UUID == ref || strconv.Itoa(d.Index) == ref {
				return d.UUID, true
			}
		}
		return "", false
	}
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := ParseGPUMap(spec, img.Host, here)
		if strings.TrimSpace(spec) == "" {
			if got != nil || err != nil {
				t.Fatalf("ParseGPUMap(%q) = %v, %v; want nothing", spec, got, err)
			}
			return
		}
		if err != nil {
			if !strings.Contains(err.Error(), "--gpu-map") {
				t.Fatalf("ParseGPUMap(%q): error %q does not name the flag", spec, err)
			}
			return
		}
		pairs := strings.Split(spec, ",")
		if len(got) != len(pairs) {
			t.Fatalf("ParseGPUMap(%q) = %v: %d pairs given", spec, got, len(pairs))
		}
		onto := map[string]bool{}
		for _, p := range pairs {
			o, n, _ := strings.Cut(p, "=")
			old, ok1 := resolve(img.Host, o)
			dst, ok2 := resolve(here, n)
			if !ok1 || !ok2 || got[old] != dst || onto[dst] {
				t.Fatalf("ParseGPUMap(%q) = %v: pair %q", spec, got, p)
			}
			onto[dst] = true
		}

		all := Skips{}
		for _, c := range checks {
			all[c.Name] = true
		}
		moves, err := PlanMapping(img, here, got, all)
		if err != nil {
			t.Fatalf("PlanMapping refuses the map ParseGPUMap(%q) = %v: %v", spec, got, err)
		}
		for old, dst := range got {
			if old != dst && moves[old] != dst {
				t.Fatalf("--gpu-map %q sends %s to %s; PlanMapping moves it to %q", spec, old, dst, moves[old])
			}
		}
	})
}
