// Package hosttune changes a host setting for the length of one operation and puts it back:
// transparent huge pages make the CUDA driver's staging of GPU memory in host memory, and
// CRIU's refilling of it, markedly faster (measured in docs/benchmarks.md).
package hosttune

import (
	"fmt"
	"os"
	"strings"
)

// THPPath is the kernel's transparent huge page switch.
const THPPath = "/sys/kernel/mm/transparent_hugepage/enabled"

// THPAlways sets transparent huge pages to "always" and returns the function that puts the
// previous mode back; the caller defers it so that failures restore it too. record, when
// not nil, is told the previous mode before anything changes (a journal keeps it, so that
// the mode is put back even if the caller dies); its error leaves THP as it is. When THP is
// already "always", or the kernel has no THP switch, nothing changes.
func THPAlways(path string, record func(prev string) error) (restore func() error, err error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return func() error { return nil }, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read THP mode: %w", err)
	}
	prev, err := selected(string(b))
	if err != nil {
		return nil, fmt.Errorf("read THP mode from %s: %w", path, err)
	}
	if prev == "always" {
		return func() error { return nil }, nil
	}
	if record != nil {
		if err := record(prev); err != nil {
			return nil, err
		}
	}
	if err := Set(path, "always"); err != nil {
		return nil, err
	}
	return func() error { return Set(path, prev) }, nil
}

// PutBack sets the transparent huge page mode at path back to mode, unless it is mode
// already: a journal records the old mode before the change, and a change that failed (a
// read-only /sys) left a record whose rollback failed on every try (review). A switch
// gone with the kernel's THP has nothing to put back.
func PutBack(path, mode string) error {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err == nil {
		if cur, serr := selected(string(b)); serr == nil && cur == mode {
			return nil
		}
	}
	return Set(path, mode)
}

// Set writes a transparent huge page mode.
func Set(path, mode string) error {
	if err := os.WriteFile(path, []byte(mode), 0); err != nil {
		return fmt.Errorf("set THP to %s: %w", mode, err)
	}
	return nil
}

// selected returns the bracketed mode of a line such as "always [madvise] never", or the
// one word of a line that holds only a mode (a stand-in switch in tests).
func selected(line string) (string, error) {
	if f := strings.Fields(line); len(f) == 1 {
		return strings.Trim(f[0], "[]"), nil
	}
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") {
			return strings.Trim(f, "[]"), nil
		}
	}
	return "", fmt.Errorf("no selected mode in %q", strings.TrimSpace(line))
}
