package nvidia

import (
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
)

func TestPermutationCompletesMoves(t *testing.T) {
	host := []string{"A", "B", "C"}
	cases := []struct {
		name  string
		moves map[string]string
		want  map[string]string
	}{
		{"none", nil, map[string]string{}},
		{"move onto a busy GPU swaps", map[string]string{"A": "B"}, map[string]string{"A": "B", "B": "A"}},
		{"explicit swap stays", map[string]string{"A": "B", "B": "A"}, map[string]string{"A": "B", "B": "A"}},
		{"cycle", map[string]string{"A": "B", "B": "C"}, map[string]string{"A": "B", "B": "C", "C": "A"}},
		{"from another host", map[string]string{"X": "A"}, map[string]string{"X": "A"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Permutation(c.moves, host); !maps.Equal(got, c.want) {
				t.Fatalf("Permutation(%v) = %v, want %v", c.moves, got, c.want)
			}
		})
	}
}

func TestNoDriverMeansGPUSupportOff(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA driver")
	}
	_, err := Open()
	if err == nil || !strings.Contains(err.Error(), "NVIDIA GPU support is off") {
		t.Fatalf("Open() = %v, want a reason that GPU support is off", err)
	}
	ready, off := gpu.Probe()
	if len(ready) != 0 || off["nvidia"] == nil {
		t.Fatalf("Probe() = %v, %v; want nvidia unavailable", ready, off)
	}
}
