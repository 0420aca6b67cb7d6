package nvidia

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	gpucrimage "github.com/gpucr/gpucr/internal/image"
)

func h100(index int, uuid string, numa int) gpu.Device {
	return gpu.Device{Index: index, UUID: uuid, Name: "NVIDIA H100 80GB HBM3", MemoryTotal: 80 << 30, MemoryUsed: 17 << 30, NUMANode: numa,
		Properties: gpu.Properties{propCompute: "9.0", propL2: strconv.Itoa(50 << 20)}}
}

// image describes a checkpoint of devs where one process used the devices named in used.
func image(used []string, devs ...gpu.Device) gpu.Snapshot {
	return gpu.Snapshot{
		Host:      gpu.Host{Backend: "nvidia", DriverVersion: "580.159.04", Devices: devs},
		Processes: []gpu.Process{{PID: 100, Devices: used}},
	}
}

// holding gives img's one process b bytes of device memory on each GPU it used.
func holding(b uint64, img gpu.Snapshot) gpu.Snapshot {
	p := &img.Processes[0]
	p.DeviceMemory = map[string]uint64{}
	for _, u := range p.Devices {
		p.DeviceMemory[u] = b
		p.MemoryBytes += b
	}
	return img
}

func host(devs ...gpu.Device) gpu.Host {
	return gpu.Host{Backend: "nvidia", DriverVersion: "580.159.04", Devices: devs}
}

func noEnv(string) string { return "" }

// withProp is a copy of d's properties with name set to v ("" removes it).
func withProp(d gpu.Device, name, v string) gpu.Properties {
	p := maps.Clone(d.Properties)
	delete(p, name)
	if v != "" {
		p[name] = v
	}
	return p
}

// skipsFrom switches the backend's checks off as the command line does.
func skipsFrom(flags []string, getenv func(string) string) (Skips, error) {
	s, err := gpu.SkipsFrom([]gpu.Vendor{{Name: Name, Checks: checks}}, flags, getenv)
	if err != nil {
		return nil, err
	}
	return Skips(s.For(Name)), nil
}

func TestChecksList(t *testing.T) {
	want := map[string]string{
		"driver-version": "NV_DRIVER_VER_CHECK", "compute-capability": "NV_COMPUTE_CAP_CHECK",
		"memory": "NV_MEMORY_CHECK", "model": "NV_MODEL_CHECK", "l2-cache": "NV_L2_CHECK", "numa": "NV_NUMA_CHECK",
	}
	got := map[string]string{}
	for _, c := range checks {
		if c.Doc == "" {
			t.Errorf("check %s has no Doc", c.Name)
		}
		got[c.Name] = c.Env
	}
	if !maps.Equal(got, want) {
		t.Fatalf("checks = %v, want %v", got, want)
	}
}

// TestEachCheckFailsAndSkips makes each check fail on its own, then switches it off by
// flag and by environment variable.
func TestEachCheckFailsAndSkips(t *testing.T) {
	a, b := h100(0, "GPU-a", 0), h100(1, "GPU-b", 0)
	cases := []struct {
		check, env string
		image      gpu.Snapshot
		host       func(h *gpu.Host)
		want       string // the whole message, or a part of it
	}{
		{"driver-version", "NV_DRIVER_VER_CHECK", image([]string{"GPU-a"}, a),
			func(h *gpu.Host) { h.DriverVersion = "535.104.05" },
			"GPU driver: version older than the image's: image 580.159.04, host 535.104.05 (skip with --skip-check driver-version or NV_DRIVER_VER_CHECK=0)"},
		{"compute-capability", "NV_COMPUTE_CAP_CHECK", image([]string{"GPU-a"}, a),
			func(h *gpu.Host) { h.Devices[0].Properties = withProp(h.Devices[0], propCompute, "8.0") },
			"GPU 0 (GPU-a): compute capability differs: image 9.0, host 8.0 (skip with --skip-check compute-capability or NV_COMPUTE_CAP_CHECK=0)"},
		{"memory", "NV_MEMORY_CHECK", holding(20<<30, image([]string{"GPU-a"}, a)),
			func(h *gpu.Host) { h.Devices[0].MemoryUsed = 70 << 30 },
			"GPU 0 (GPU-a): not enough free memory (free some there, or move it with --gpu-map): image 20.0 GiB held by its processes, host 10.0 GiB free of 80.0 GiB (skip with --skip-check memory or NV_MEMORY_CHECK=0)"},
		{"model", "NV_MODEL_CHECK", image([]string{"GPU-a"}, a),
			func(h *gpu.Host) { h.Devices[0].Name = "NVIDIA H100 PCIe" },
			"GPU 0 (GPU-a): model differs: image NVIDIA H100 80GB HBM3, host NVIDIA H100 PCIe (skip with --skip-check model or NV_MODEL_CHECK=0)"},
		{"l2-cache", "NV_L2_CHECK", image([]string{"GPU-a"}, a),
			func(h *gpu.Host) { h.Devices[0].Properties = withProp(h.Devices[0], propL2, strconv.Itoa(60<<20)) },
			"GPU 0 (GPU-a): L2 cache size differs: image 50 MiB, host 60 MiB (skip with --skip-check l2-cache or NV_L2_CHECK=0)"},
		{"numa", "NV_NUMA_CHECK", image([]string{"GPU-a", "GPU-b"}, a, b),
			func(h *gpu.Host) { h.Devices[1].NUMANode = 1 },
			"image GPUs 0 and 1 on host GPUs 0 and 1: NUMA grouping differs: image both on node 0, host on nodes 0 and 1 (skip with --skip-check numa or NV_NUMA_CHECK=0)"},
	}
	for _, c := range cases {
		t.Run(c.check, func(t *testing.T) {
			h := host(a, b)
			c.host(&h)
			_, err := PlanMapping(c.image, h, nil, Skips{})
			var ie *gpu.IncompatibleError
			if !errors.As(err, &ie) || !errors.Is(err, gpu.ErrIncompatible) {
				t.Fatalf("err = %v, want an *gpu.IncompatibleError matching gpu.ErrIncompatible", err)
			}
			if ie.Check != c.check || ie.Env != c.env || err.Error() != c.want {
				t.Fatalf("err = %q (check %s, env %s)\nwant %q", err, ie.Check, ie.Env, c.want)
			}
			byFlag, err := skipsFrom([]string{c.check}, noEnv)
			if err != nil {
				t.Fatal(err)
			}
			byEnv, err := skipsFrom(nil, func(k string) string { return map[string]string{c.env: "0"}[k] })
			if err != nil {
				t.Fatal(err)
			}
			for how, s := range map[string]Skips{"flag": byFlag, "env": byEnv} {
				if got, err := PlanMapping(c.image, h, nil, s); err != nil || got != nil {
					t.Errorf("skipped by %s: got %v, %v; want no move, no error", how, got, err)
				}
			}
		})
	}
}

func TestSkipsOfTheNVIDIAChecks(t *testing.T) {
	cases := []struct {
		name    string
		flags   []string
		env     map[string]string
		want    Skips
		wantErr string
	}{
		{"nothing skipped", nil, nil, Skips{}, ""},
		{"by flag", []string{"numa", "model"}, nil, Skips{"numa": true, "model": true}, ""},
		{"by env", nil, map[string]string{"NV_L2_CHECK": "0", "NV_MEMORY_CHECK": "0"}, Skips{"l2-cache": true, "memory": true}, ""},
		{"env other than 0 keeps the check", nil, map[string]string{"NV_L2_CHECK": "1", "NV_MODEL_CHECK": ""}, Skips{}, ""},
		{"flag and env", []string{"driver-version"}, map[string]string{"NV_COMPUTE_CAP_CHECK": "0"}, Skips{"driver-version": true, "compute-capability": true}, ""},
		{"unknown name", []string{"colour"}, nil, nil,
			`unknown check "colour" for --skip-check; the checks are driver-version, compute-capability, memory, model, l2-cache, numa`},
		{"env name is not a check name", []string{"NV_L2_CHECK"}, nil, nil, "unknown check"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := skipsFrom(c.flags, func(k string) string { return c.env[k] })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) {
				t.Fatalf("SkipsFrom = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestParseGPUMap(t *testing.T) {
	img := host(h100(0, "GPU-a", 0), h100(1, "GPU-b", 0))
	here := host(h100(0, "GPU-x", 0), h100(1, "GPU-y", 0), h100(2, "GPU-a", 0))
	cases := []struct {
		spec    string
		want    map[string]string
		wantErr string
	}{
		{"", nil, ""},
		{"  ", nil, ""},
		{"0=1,1=0", map[string]string{"GPU-a": "GPU-y", "GPU-b": "GPU-x"}, ""},
		{"0=2", map[string]string{"GPU-a": "GPU-a"}, ""},
		{"GPU-a=GPU-y", map[string]string{"GPU-a": "GPU-y"}, ""},
		{"1=GPU-a, GPU-a = 0", map[string]string{"GPU-b": "GPU-a", "GPU-a": "GPU-x"}, ""},
		{"2=0", nil, `the image has no GPU "2"`},
		{"0=3", nil, `this host has no GPU "3"`},
		{"GPU-x=0", nil, `the image has no GPU "GPU-x"`},
		{"0=GPU-b", nil, `this host has no GPU "GPU-b"`},
		{"0=1,1=1", nil, "puts image GPUs 0 and 1 both on host GPU 1 (GPU-y)"},
		{"0=1,GPU-a=2", nil, "maps image GPU 0 (GPU-a) twice"},
		{"0:1", nil, `--gpu-map "0:1": want OLD=NEW pairs`},
		{"0=1,", nil, "want OLD=NEW pairs"},
		{"0=", nil, `--gpu-map "0=": want OLD=NEW pairs`},
		{" =1", nil, `--gpu-map "=1": want OLD=NEW pairs`},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			got, err := ParseGPUMap(c.spec, img, here)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, gpu.ErrBadGPUMap) {
					t.Fatalf("err = %v, want %q, a bad --gpu-map", err, c.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) || (c.want == nil) != (got == nil) {
				t.Fatalf("ParseGPUMap(%q) = %v, %v; want %v", c.spec, got, err, c.want)
			}
		})
	}
}

// A crafted image may give a GPU a UUID that is another GPU's index: the ref is refused
// as ambiguous instead of taking whichever comes first.
func TestParseGPUMapRefusesAnAmbiguousRef(t *testing.T) {
	img := host(h100(0, "1", 0), h100(1, "GPU-b", 0))
	here := host(h100(0, "GPU-x", 0), h100(1, "GPU-y", 0))
	if _, err := ParseGPUMap("1=0", img, here); err == nil || !strings.Contains(err.Error(), `the image has two GPUs named "1"`) {
		t.Fatalf("ParseGPUMap(1=0) err = %v, want the ref refused as naming two GPUs", err)
	}
	if got, err := ParseGPUMap("GPU-b=0", img, here); err != nil || got["GPU-b"] != "GPU-x" {
		t.Fatalf("ParseGPUMap(GPU-b=0) = %v, %v", got, err)
	}
}

func TestPlanMapping(t *testing.T) {
	a, b := h100(0, "GPU-a", 0), h100(1, "GPU-b", 0)
	x, y, z := h100(0, "GPU-x", 0), h100(1, "GPU-y", 0), h100(2, "GPU-z", 1)
	ampere := gpu.Device{Index: 0, UUID: "GPU-old", Name: "NVIDIA A100-SXM4-80GB", MemoryTotal: 80 << 30, NUMANode: 0,
		Properties: gpu.Properties{propCompute: "8.0", propL2: strconv.Itoa(40 << 20)}}
	at := func(d gpu.Device, index, numa int) gpu.Device { d.Index, d.NUMANode = index, numa; return d }
	cases := []struct {
		name      string
		image     gpu.Snapshot
		host      gpu.Host
		gpuMap    string
		skip      []string
		want      map[string]string
		wantErr   string
		wantCheck string // the gpu.IncompatibleError's check, when one is expected
	}{
		{name: "same GPUs stay", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(a, b)},
		{name: "unused GPUs stay too", image: image([]string{"GPU-b"}, a, b), host: host(a, b, x)},
		{name: "swap by index", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(a, b), gpuMap: "0=1,1=0",
			want: map[string]string{"GPU-a": "GPU-b", "GPU-b": "GPU-a"}},
		{name: "moved onto an unused GPU, which takes the freed one", image: image([]string{"GPU-a"}, a, b), host: host(a, b),
			gpuMap: "GPU-a=GPU-b", want: map[string]string{"GPU-a": "GPU-b", "GPU-b": "GPU-a"}},
		{name: "moved onto a used GPU, whose state moves to the freed one", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(a, b),
			gpuMap: "0=1", want: map[string]string{"GPU-a": "GPU-b", "GPU-b": "GPU-a"}},
		{name: "original absent: lowest free index", image: image([]string{"GPU-a"}, a), host: host(x, y),
			want: map[string]string{"GPU-a": "GPU-x"}},
		{name: "original absent: first compatible", image: image([]string{"GPU-a"}, a), host: host(ampere, y),
			want: map[string]string{"GPU-a": "GPU-y"}},
		{name: "original absent: GPUs kept by others are not free", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(at(b, 0, 0), at(y, 1, 0)),
			want: map[string]string{"GPU-a": "GPU-y"}},
		{name: "unused image GPUs take the remaining host GPUs", image: image([]string{"GPU-b"}, a, b), host: host(x, y, z),
			want: map[string]string{"GPU-b": "GPU-x", "GPU-a": "GPU-y"}},
		{name: "unused image GPUs beyond the host's are left out", image: image([]string{"GPU-a"}, a, b), host: host(x),
			want: map[string]string{"GPU-a": "GPU-x"}},
		{name: "unknown L2 size is not compared", image: image([]string{"GPU-a"}, a),
			host: host(func() gpu.Device { d := a; d.Properties = withProp(a, propL2, ""); return d }())},
		{name: "NUMA: absent GPUs that shared a node get a shared node", image: image([]string{"GPU-a", "GPU-b"}, a, b),
			host: host(at(x, 0, 0), at(y, 1, 1), at(z, 2, 1)), want: map[string]string{"GPU-a": "GPU-y", "GPU-b": "GPU-z"}},
		{name: "NUMA: absent GPUs on distinct nodes stay distinct", image: image([]string{"GPU-a", "GPU-b"}, a, at(b, 1, 1)),
			host: host(at(x, 0, 0), at(y, 1, 0), at(z, 2, 1)), want: map[string]string{"GPU-a": "GPU-x", "GPU-b": "GPU-z"}},
		{name: "NUMA: unknown nodes are not compared", image: image([]string{"GPU-a", "GPU-b"}, at(a, 0, -1), at(b, 1, -1)),
			host: host(at(x, 0, 0), at(y, 1, 1)), want: map[string]string{"GPU-a": "GPU-x", "GPU-b": "GPU-y"}},
		{name: "NUMA: grouping cannot be kept", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(at(x, 0, 0), at(y, 1, 1)),
			wantErr: "cannot keep their NUMA grouping here: image GPUs 0 and 1 on host GPUs 0 and 1: NUMA grouping differs", wantCheck: "numa"},
		{name: "NUMA: skipped", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(at(x, 0, 0), at(y, 1, 1)), skip: []string{"numa"},
			want: map[string]string{"GPU-a": "GPU-x", "GPU-b": "GPU-y"}},
		{name: "NUMA: explicit map checked", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(a, b, z), gpuMap: "1=2",
			wantErr: "NUMA grouping differs", wantCheck: "numa"},
		{name: "no compatible GPU", image: image([]string{"GPU-a"}, a), host: host(ampere),
			wantErr:   "image GPU 0 (GPU-a) is not on this host, and no free GPU here can take it; first refusal: image GPU 0 (GPU-a) on host GPU 0 (GPU-old): compute capability differs: image 9.0, host 8.0",
			wantCheck: "compute-capability"},
		{name: "no compatible GPU, but the check is skipped", image: image([]string{"GPU-a"}, a), host: host(ampere),
			skip: []string{"compute-capability", "model", "l2-cache"}, want: map[string]string{"GPU-a": "GPU-old"}},
		{name: "no free GPU", image: image([]string{"GPU-a", "GPU-b"}, a, b), host: host(at(b, 0, 0)),
			wantErr: "incompatible GPU: this host lacks image GPU 0 (GPU-a) and has too few free GPUs that pass the checks"},
		{name: "explicit map onto an incompatible GPU", image: image([]string{"GPU-a"}, a), host: host(a, at(ampere, 1, 0)), gpuMap: "0=1",
			wantErr: "image GPU 0 (GPU-a) on host GPU 1 (GPU-old): compute capability differs", wantCheck: "compute-capability"},
		{name: "explicit map of an unused GPU is not checked", image: image([]string{"GPU-a"}, a, b), host: host(a, at(ampere, 1, 0)), gpuMap: "1=1",
			want: map[string]string{"GPU-b": "GPU-old"}},
		{name: "host driver newer", image: image([]string{"GPU-a"}, a), host: func() gpu.Host { h := host(a); h.DriverVersion = "590.1"; return h }()},
		{name: "host driver older", image: image([]string{"GPU-a"}, a), host: func() gpu.Host { h := host(a); h.DriverVersion = "580.65.06"; return h }(),
			wantErr: "image 580.159.04, host 580.65.06", wantCheck: "driver-version"},
		{name: "process on a GPU the image does not describe", image: image([]string{"GPU-q"}, a), host: host(a),
			wantErr: "image process 100 used GPU GPU-q, which the image does not describe"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			explicit, err := ParseGPUMap(c.gpuMap, c.image.Host, c.host)
			if err != nil {
				t.Fatal(err)
			}
			skips, err := skipsFrom(c.skip, noEnv)
			if err != nil {
				t.Fatal(err)
			}
			got, err := PlanMapping(c.image, c.host, explicit, skips)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v\nwant %q", err, c.wantErr)
				}
				var ie *gpu.IncompatibleError
				if c.wantCheck != "" && (!errors.As(err, &ie) || ie.Check != c.wantCheck) {
					t.Fatalf("err = %v, want an *gpu.IncompatibleError of check %s", err, c.wantCheck)
				}
				if c.wantCheck != "" && !errors.Is(err, gpu.ErrIncompatible) {
					t.Fatalf("err = %v does not match gpu.ErrIncompatible", err)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) || (c.want == nil) != (got == nil) {
				t.Fatalf("PlanMapping = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestPlanMappingExplicitMustNameKnownGPUs(t *testing.T) {
	a := h100(0, "GPU-a", 0)
	for explicit, want := range map[string]string{
		"GPU-q=GPU-a": "GPU map moves GPU GPU-q, which the image does not have",
		"GPU-a=GPU-q": "GPU map sends image GPU 0 (GPU-a) to GPU-q, which this host does not have",
	} {
		old, dst, _ := strings.Cut(explicit, "=")
		if _, err := PlanMapping(image([]string{"GPU-a"}, a), host(a), map[string]string{old: dst}, nil); err == nil || err.Error() != want {
			t.Errorf("PlanMapping with %s: %v, want %q", explicit, err, want)
		}
	}
}

// TestPlanMappingSearchStaysSmall gives the search a NUMA grouping it cannot keep on 16
// GPUs, where trying every assignment would never end.
func TestPlanMappingSearchStaysSmall(t *testing.T) {
	var img, here []gpu.Device
	var used []string
	for i := range 16 {
		img = append(img, h100(i, fmt.Sprintf("GPU-img%d", i), 0))
		used = append(used, img[i].UUID)
		here = append(here, h100(i, fmt.Sprintf("GPU-host%d", i), i/8))
	}
	_, err := PlanMapping(image(used, img...), host(here...), nil, nil)
	if !errors.Is(err, gpu.ErrIncompatible) || !strings.Contains(err.Error(), "NUMA grouping differs") {
		t.Fatalf("err = %v, want a NUMA incompatibility", err)
	}
	got, err := PlanMapping(image(used, img...), host(here...), nil, Skips{"numa": true})
	if err != nil || len(got) != 16 {
		t.Fatalf("with numa skipped: %v, %v; want all 16 moved", got, err)
	}
}

func TestCompareVersions(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"580.159.04", "580.159.04", 0},
		{"535.104.05", "580.159.04", -1},
		{"580.159.04", "535.104.05", 1},
		{"580.65.06", "580.159.04", -1},
		{"580.159.4", "580.159.04", 0},
		{"580.159", "580.159.04", -1},
		{"590", "580.159.04", 1},
		{"", "580.159.04", -1},
		{"", "", 0},
	}
	for _, c := range cases {
		if got := compareVersions(c.a, c.b); got != c.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// The memory check weighs what the image's own processes held against what the host GPU
// has free now. It compared the image GPU's memory in use by every process at checkpoint
// time with the host GPU's total: a restore onto a GPU too busy to take the job went on,
// CRIU restored the tree and the driver's restore then failed; a restore onto a smaller
// GPU was refused for memory other jobs had held.
func TestMemoryCheckWeighsTheJobAgainstFreeMemory(t *testing.T) {
	a, b := h100(0, "GPU-a", 0), h100(1, "GPU-b", 0)
	busy := a
	busy.MemoryUsed = 75 << 30
	if _, err := PlanMapping(holding(8<<30, image([]string{"GPU-a"}, a)), host(busy, b), nil, Skips{}); !errors.Is(err, gpu.ErrIncompatible) {
		t.Fatalf("8 GiB onto a GPU with 5 GiB free: err = %v, want refused", err)
	}
	small := a
	small.UUID, small.MemoryTotal, small.MemoryUsed = "GPU-small", 40<<30, 1<<30
	crowded := holding(8<<30, image([]string{"GPU-a"}, a))
	crowded.Devices[0].MemoryUsed = 79 << 30 // other jobs' memory at checkpoint time
	got, err := PlanMapping(crowded, host(small), nil, Skips{checkModel: true})
	if err != nil || got["GPU-a"] != "GPU-small" {
		t.Fatalf("8 GiB onto a 40 GiB GPU with 39 free: got %v, %v; want moved there", got, err)
	}
	// An image GPU this host lacks goes to a GPU with room for it, though an earlier one
	// is alike in every other way.
	x := h100(0, "GPU-x", 0)
	got, err = PlanMapping(holding(8<<30, image([]string{"GPU-x"}, x)), host(busy, b), nil, Skips{})
	if err != nil || got["GPU-x"] != "GPU-b" {
		t.Fatalf("got %v, %v; want GPU-x on GPU-b, the one with room", got, err)
	}
}

func TestMemoryNeeds(t *testing.T) {
	got := memoryNeeds([]gpu.Process{
		{PID: 1, Devices: []string{"GPU-a", "GPU-b"}, MemoryBytes: 5, DeviceMemory: map[string]uint64{"GPU-a": 1, "GPU-b": 4, "GPU-c": 9}},
		{PID: 2, Devices: []string{"GPU-a", "GPU-b"}, MemoryBytes: 6}, // an image before the per-GPU record
		{PID: 3, Devices: []string{"GPU-c"}, DeviceMemory: map[string]uint64{"GPU-c": math.MaxUint64 - 1}},
		{PID: 4, Devices: []string{"GPU-c"}, DeviceMemory: map[string]uint64{"GPU-c": 7}},
	})
	want := map[string]uint64{"GPU-a": 4, "GPU-b": 7, "GPU-c": math.MaxUint64}
	if !maps.Equal(got, want) {
		t.Fatalf("memoryNeeds = %v, want %v", got, want)
	}
}

// An image whose CRIU files hold the plugin's records while its GPU record lists no process
// the plugin carries is refused before anything runs: the restore loaded no plugin and
// CRIU failed on those files midway (hostile test).
func TestRecordsWithoutHoldersAreRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gpucr-nvidia-file-4"), []byte("/dev/nvidiactl\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := newBackend(mockNVML(), &fakeDriver{})
	for _, snap := range []*gpu.Snapshot{nil, {Host: host()}} {
		if _, err := b.PlanRestore(context.Background(), gpu.RestoreInput{CRIUDir: dir, Snapshot: snap}); !errors.Is(err, gpucrimage.ErrCorrupt) {
			t.Fatalf("snapshot %v: err = %v, want the image refused as corrupted", snap, err)
		}
	}
}
