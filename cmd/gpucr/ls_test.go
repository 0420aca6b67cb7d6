package main

import (
	"strings"
	"testing"
	"time"
)

// ls's table writes sizes in binary units a reader takes in at a glance, not byte counts.
func TestLsTableWritesReadableSizes(t *testing.T) {
	var b strings.Builder
	printLs(&b, []lsEntry{
		{URL: "s3://b/ckpt", Created: time.Unix(0, 0), Host: "h", Processes: 2, RootPID: 7,
			MemoryBytes: 64 << 20, StoredBytes: 3 << 29},
		{URL: "s3://b/broken", Problem: "manifest.json: unexpected end of JSON input"},
	})
	out := b.String()
	for _, want := range []string{"64 MiB", "1.5 GiB", "2 (root 7)", "s3://b/broken  unusable: manifest.json"} {
		if !strings.Contains(out, want) {
			t.Errorf("ls table lacks %q:\n%s", want, out)
		}
	}
}
