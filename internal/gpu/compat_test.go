package gpu

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

func h100(i int, uuid string, numa int) Device {
	return Device{Index: i, UUID: uuid, Name: "NVIDIA H100 80GB HBM3", ComputeCapability: "9.0",
		MemoryTotal: 80 << 30, MemoryUsed: 17 << 30, L2CacheBytes: 50 << 20, NUMANode: numa}
}

func snapshot(devs ...Device) Snapshot {
	s := Snapshot{Host: Host{DriverVersion: "580.159.04", Devices: devs}}
	for _, d := range devs {
		s.Processes = append(s.Processes, Process{PID: 100 + d.Index, Devices: []string{d.UUID}})
	}
	return s
}

func TestChecksRefuseAndSkip(t *testing.T) {
	img := snapshot(h100(0, "GPU-a", 0))
	cases := []struct {
		check, env string
		host       func(*Host)
		want       string
	}{
		{"driver-version", "NV_DRIVER_VER_CHECK", func(h *Host) { h.DriverVersion = "535.104.05" }, "driver version"},
		{"compute-capability", "NV_COMPUTE_CAP_CHECK", func(h *Host) { h.Devices[0].ComputeCapability = "8.0" }, "image 9.0, host 8.0"},
		{"memory", "NV_MEMORY_CHECK", func(h *Host) { h.Devices[0].MemoryTotal = 16 << 30 }, "memory"},
		{"model", "NV_MODEL_CHECK", func(h *Host) { h.Devices[0].Name = "NVIDIA H200" }, "model"},
		{"l2-cache", "NV_L2_CHECK", func(h *Host) { h.Devices[0].L2CacheBytes = 60 << 20 }, "L2 cache"},
	}
	for _, c := range cases {
		t.Run(c.check, func(t *testing.T) {
			host := Host{DriverVersion: "580.159.04", Devices: []Device{h100(0, "GPU-a", 0)}}
			c.host(&host)
			_, err := PlanMapping(img, host, nil, Skips{})
			var ie *IncompatibleError
			if !errors.As(err, &ie) || !errors.Is(err, ErrIncompatible) || ie.Check != c.check ||
				!strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--skip-check "+c.check) ||
				!strings.Contains(err.Error(), c.env+"=0") {
				t.Fatalf("err = %v, want %s failing with %q and both switches", err, c.check, c.want)
			}
			byFlag, err := SkipsFrom([]string{c.check}, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			byEnv, _ := SkipsFrom(nil, func(k string) string { return map[string]string{c.env: "0"}[k] })
			for _, s := range []Skips{byFlag, byEnv} {
				if _, err := PlanMapping(img, host, nil, s); err != nil {
					t.Errorf("with %v skipped: %v", s, err)
				}
			}
		})
	}
}

func TestSkipsFromRejectsUnknownNames(t *testing.T) {
	if _, err := SkipsFrom([]string{"colour"}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "compute-capability") {
		t.Fatalf("err = %v, want the list of known checks", err)
	}
}

func TestPlanMapping(t *testing.T) {
	a, b, c := h100(0, "GPU-a", 0), h100(1, "GPU-b", 0), h100(2, "GPU-c", 1)
	host := func(ds ...Device) Host { return Host{DriverVersion: "580.159.04", Devices: ds} }
	cases := []struct {
		name    string
		img     Snapshot
		host    Host
		gpuMap  string
		want    map[string]string
		wantErr string
	}{
		{"same GPUs stay", snapshot(a, b), host(a, b), "", nil, ""},
		{"swap by index", snapshot(a, b), host(a, b), "0=1,1=0", map[string]string{"GPU-a": "GPU-b", "GPU-b": "GPU-a"}, ""},
		{"move by UUID", snapshot(a), host(a, b), "GPU-a=GPU-b", map[string]string{"GPU-a": "GPU-b"}, ""},
		{"original absent picks a free compatible GPU", snapshot(a), host(h100(0, "GPU-x", 0), h100(1, "GPU-y", 0)), "", map[string]string{"GPU-a": "GPU-x"}, ""},
		{"absent GPU avoids GPUs kept by others", snapshot(a, b), host(h100(0, "GPU-b", 0), h100(1, "GPU-y", 0)), "", map[string]string{"GPU-a": "GPU-y"}, ""},
		{"no compatible GPU", snapshot(a), host(Device{Index: 0, UUID: "GPU-z", Name: "other", ComputeCapability: "8.0", MemoryTotal: 80 << 30}), "", nil, "compute capability"},
		{"numa grouping kept", snapshot(a, b), host(a, b, c), "1=2", nil, "NUMA"},
		{"unknown index", snapshot(a), host(a), "0=7", nil, "no GPU"},
		{"two onto one", snapshot(a, b), host(a, b), "0=1,1=1", nil, "both on host GPU"},
		{"bad syntax", snapshot(a), host(a), "0:1", nil, "OLD=NEW"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			explicit, err := ParseGPUMap(c.gpuMap, c.img.Host, c.host)
			var got map[string]string
			if err == nil {
				got, err = PlanMapping(c.img, c.host, explicit, Skips{})
			}
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"580.159.04", "580.159.04", 0}, {"535.104.05", "580.159.04", -1}, {"580.65", "580.159.04", -1}, {"590.1", "580.159.04", 1}} {
		if got := CompareVersions(c.a, c.b); got != c.want {
			t.Errorf("CompareVersions(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
