package placement

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
)

// TestSkipsFrom proves every check is on by default, each goes off by its variable or its
// name, and bad values or names are refused.
// skipsFrom switches the backend's checks off as the command line does.
func skipsFrom(names []string, getenv func(string) string) (Skips, error) {
	s, err := gpu.SkipsFrom([]gpu.Vendor{{Name: "amd", Checks: checks}}, names, getenv)
	if err != nil {
		return nil, err
	}
	return Skips(s.For("amd")), nil
}

func TestSkipsOfTheAMDChecks(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		names   []string
		want    []string
		wantErr string
	}{
		{name: "defaults", want: nil},
		{name: "env 1 and yes keep checks", env: map[string]string{"KFD_FW_VER_CHECK": "1", "KFD_NUMA_CHECK": "YES"}},
		{name: "env 0", env: map[string]string{"KFD_FW_VER_CHECK": "0", "KFD_NUMA_CHECK": "0"}, want: []string{CheckFW, CheckNUMA}},
		{name: "env no", env: map[string]string{"KFD_SDMA_FW_VER_CHECK": "no", "KFD_CAPABILITY_CHECK": "NO"}, want: []string{CheckCapability, CheckSDMAFW}},
		{name: "all env", env: map[string]string{
			"KFD_FW_VER_CHECK": "0", "KFD_SDMA_FW_VER_CHECK": "0", "KFD_CACHES_COUNT_CHECK": "0", "KFD_NUM_GWS_CHECK": "0",
			"KFD_VRAM_SIZE_CHECK": "0", "KFD_NUMA_CHECK": "0", "KFD_CAPABILITY_CHECK": "0",
		}, want: []string{CheckCaches, CheckCapability, CheckFW, CheckGWS, CheckNUMA, CheckSDMAFW, CheckVRAM}},
		{name: "names", names: []string{"vram-size", "num-gws", "caches-count"}, want: []string{CheckCaches, CheckGWS, CheckVRAM}},
		{name: "bad env", env: map[string]string{"KFD_VRAM_SIZE_CHECK": "off"}, wantErr: `KFD_VRAM_SIZE_CHECK="off"`},
		{name: "bad name", names: []string{"vram"}, wantErr: `unknown check "vram" for --skip-check`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := skipsFrom(tt.names, func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Sorted(maps.Keys(s)); !slices.Equal(got, tt.want) {
				t.Errorf("skips %v, want %v", got, tt.want)
			}
		})
	}
}

// TestParseBufferSize proves the plugin's size forms parse and garbage is refused.
func TestParseBufferSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true},
		{"4096", 4096, true},
		{"1024K", 1 << 20, true},
		{"1024k", 1 << 20, true},
		{"512M", 512 << 20, true},
		{"2G", 2 << 30, true},
		{"0x1000", 4096, true},
		{"0X10M", 16 << 20, true},
		{"17179869183G", 17179869183 << 30, true},
		{"17179869184G", 0, false}, // 2^64
		{"", 0, false},
		{"G", 0, false},
		{"2GB", 0, false},
		{"2g", 0, false}, // the plugin knows only K, k, M and G
		{"-1", 0, false},
		{"+1", 0, false},
		{"1_000", 0, false},
		{"1.5G", 0, false},
		{" 2G", 0, false},
		{"lots", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseBufferSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseBufferSize(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "KFD_MAX_BUFFER_SIZE") {
			t.Errorf("ParseBufferSize(%q) error %q does not name the variable", tt.in, err)
		}
	}
}

func mi100(gpuID uint32) kfd.Node {
	return kfd.Node{
		GPUID: gpuID, ID: 2, VendorID: 0x1002, DeviceID: 0x738c, SIMDCount: 480, FWVersion: 59, SDMAFWVersion: 18,
		CachesCount: 4, NumGWS: 64, LocalMemSize: 32 << 30, Capability: 0x2e3a8280, NUMANode: 0,
	}
}

// TestDeviceCheck proves the direction of each comparison (>= for firmware, caches, GWS
// and VRAM; equality for capability and model), that each switch turns its check off, and
// the one-line error wording.
func TestDeviceCheck(t *testing.T) {
	tests := []struct {
		name  string
		host  func(*kfd.Node)
		skip  string
		want  string // "" means compatible
		check string
	}{
		{name: "same", host: func(*kfd.Node) {}},
		{name: "newer firmware", host: func(n *kfd.Node) { n.FWVersion, n.SDMAFWVersion = 60, 19 }},
		{name: "more of everything", host: func(n *kfd.Node) { n.CachesCount, n.NumGWS, n.LocalMemSize = 5, 128, 64<<30 }},
		{name: "older fw", host: func(n *kfd.Node) { n.FWVersion = 58 }, check: CheckFW,
			want: "image GPU 7 on host GPU 9: fw_version (host must be >= image): image 59, host 58 (skip with --skip-check fw-version or KFD_FW_VER_CHECK=0)"},
		{name: "older fw skipped", host: func(n *kfd.Node) { n.FWVersion = 58 }, skip: CheckFW},
		{name: "older sdma fw", host: func(n *kfd.Node) { n.SDMAFWVersion = 17 }, check: CheckSDMAFW, want: "sdma_fw_version (host must be >= image): image 18, host 17 (skip with --skip-check"},
		{name: "older sdma fw skipped", host: func(n *kfd.Node) { n.SDMAFWVersion = 17 }, skip: CheckSDMAFW},
		{name: "fewer caches", host: func(n *kfd.Node) { n.CachesCount = 3 }, check: CheckCaches, want: "caches_count (host must be >= image): image 4, host 3 (skip with --skip-check"},
		{name: "fewer caches skipped", host: func(n *kfd.Node) { n.CachesCount = 3 }, skip: CheckCaches},
		{name: "fewer gws", host: func(n *kfd.Node) { n.NumGWS = 0 }, check: CheckGWS, want: "num_gws (host must be >= image): image 64, host 0 (skip with --skip-check"},
		{name: "fewer gws skipped", host: func(n *kfd.Node) { n.NumGWS = 0 }, skip: CheckGWS},
		{name: "less vram", host: func(n *kfd.Node) { n.LocalMemSize = 16 << 30 }, check: CheckVRAM, want: "VRAM bytes (host must be >= image): image 34359738368, host 17179869184 (skip with --skip-check"},
		{name: "less vram skipped", host: func(n *kfd.Node) { n.LocalMemSize = 16 << 30 }, skip: CheckVRAM},
		{name: "more capability bits", host: func(n *kfd.Node) { n.Capability |= 1 }, check: CheckCapability, want: "capability (must be equal): image 0x2e3a8280, host 0x2e3a8281 (skip with --skip-check"},
		{name: "capability skipped", host: func(n *kfd.Node) { n.Capability = 0 }, skip: CheckCapability},
		{name: "other model", host: func(n *kfd.Node) { n.DeviceID = 0x740f }, skip: CheckFW, check: checkModel,
			want: "model (vendor:device, SIMDs) must be equal: image 1002:738c with 480 SIMDs, host 1002:740f with 480 SIMDs (this check cannot be switched off)"},
		{name: "model before switchable checks", host: func(n *kfd.Node) { n.SIMDCount, n.FWVersion = 416, 1 }, check: checkModel, want: "model"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, host := mi100(7), mi100(9)
			tt.host(&host)
			err := deviceCheck(img, host, Skips{tt.skip: tt.skip != ""})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected refusal: %v", err)
				}
				return
			}
			var ie *gpu.IncompatibleError
			if !errors.Is(err, gpu.ErrIncompatible) || !errors.As(err, &ie) || ie.Check != tt.check {
				t.Fatalf("err = %#v, want an gpu.IncompatibleError of check %s", err, tt.check)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q, want one line containing %q", msg, tt.want)
			}
		})
	}
}
