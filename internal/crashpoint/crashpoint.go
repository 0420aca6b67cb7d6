// Package crashpoint lets tests kill gpucr with SIGKILL at a named point, as an OOM kill or
// an operator's kill -9 would (or, with GPUCR_TEST_CRASH_GROUP set, its whole process group,
// as timeout -s KILL would), to prove that whatever gpucr leaves behind is recovered.
// Outside tests no point is armed and Hit costs a comparison.
package crashpoint

import (
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

var (
	mu    sync.Mutex
	armed string
	delay time.Duration
)

// Arm sets the point to die at: "NAME", or "NAME+DURATION" to die that long after NAME is
// reached (inside a long phase). "" disarms.
func Arm(spec string) error {
	name, after, ok := strings.Cut(spec, "+")
	var d time.Duration
	if ok {
		var err error
		if d, err = time.ParseDuration(after); err != nil {
			return err
		}
	}
	mu.Lock()
	armed, delay = name, d
	mu.Unlock()
	return nil
}

// Hit dies if point is the armed one, at once or after the armed delay.
func Hit(point string) {
	mu.Lock()
	match, d := armed != "" && armed == point, delay
	mu.Unlock()
	if !match {
		return
	}
	if d > 0 {
		time.AfterFunc(d, die)
		return
	}
	die()
}

func die() {
	if os.Getenv("GPUCR_TEST_CRASH_GROUP") != "" {
		// The whole process group, as timeout -s KILL or kill -9 -PGID does (CRIU with
		// gpucr, where it shares the group); the test starts gpucr as the group's leader.
		_ = syscall.Kill(0, syscall.SIGKILL)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not delivered synchronously; nothing may run on
}
