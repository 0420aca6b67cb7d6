package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
	"testing"
)

// A restore on another node moves the image's GPUs to the node's own: the text summary
// lists each move, and --json carries the same map.
func TestRestoreSummaryReportsMovedGPUs(t *testing.T) {
	moved := map[string]map[string]string{"nvidia": {"GPU-b": "GPU-y", "GPU-a": "GPU-x"}}
	out := restoreOutput{Dir: "/img", RootPID: 42, GPUMap: moved}
	var text bytes.Buffer
	printRestore(&app{stdout: &text}, out, nil)
	if !strings.Contains(text.String(), "  nvidia GPU GPU-a -> GPU-x\n  nvidia GPU GPU-b -> GPU-y\n") {
		t.Errorf("text summary:\n%s", text.String())
	}
	var js bytes.Buffer
	if err := (&app{stdout: &js, json: true}).emit(out, nil); err != nil {
		t.Fatal(err)
	}
	var got struct {
		GPUMap map[string]map[string]string `json:"gpuMap"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || !maps.Equal(got.GPUMap["nvidia"], moved["nvidia"]) {
		t.Errorf("--json gpuMap = %v, %v; want %v", got.GPUMap, err, moved)
	}
}
