package main

import (
	"strings"
	"testing"
)

// A user's gpucr check failed CRIU's check as well, and said only CRIU's advice (setcap
// its binary), which gpucr, refusing every verb to any user but root, never takes: the
// line names root first.
func TestNotReadyNamesRootFirst(t *testing.T) {
	r := checkReport{Root: false, CRIU: criuStatus{OK: false, Error: "criu check: exit status 1: setcap cap_checkpoint_restore+eip criu"}}
	if got := notReadyReason(r); !strings.Contains(got, "must run as root") {
		t.Errorf("not ready as a user with CRIU's check failing: %q, want root named", got)
	}
	r.Root = true
	if got := notReadyReason(r); got != r.CRIU.Error {
		t.Errorf("not ready as root with CRIU's check failing: %q, want CRIU's error", got)
	}
}
