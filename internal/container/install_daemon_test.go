package container

import (
	"strings"
	"testing"
)

// A CRIU page server or lazy-pages daemon is told by any word of its command line (options
// may come first); one that also names a command that runs scripts is not a daemon.
func TestIsDaemon(t *testing.T) {
	for line, want := range map[string]bool{
		"criu page-server":                   true,
		"criu -v4 page-server":               true,
		"criu -D /d --port 27 page-server":   true,
		"/usr/sbin/criu -o x.log lazy-pages": true,
		"criu swrk 3":                        false,
		"criu dump -t 42":                    false,
		"criu -o page-server dump":           false,
		"criu":                               false,
	} {
		if got := isDaemon([]byte(strings.ReplaceAll(line, " ", "\x00") + "\x00")); got != want {
			t.Errorf("isDaemon(%q) = %v, want %v", line, got, want)
		}
	}
}
