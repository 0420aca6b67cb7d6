package proctree

import (
	"fmt"
	"os"
	"testing"
)

func TestParseMapping(t *testing.T) {
	for _, c := range []struct {
		line      string
		ok        bool
		want      Mapping
		privAnon  bool
		writeable bool
	}{
		{"7f0000000000-7f0000400000 rw-p 00000000 00:00 0 ", true, Mapping{0x7f0000000000, 0x7f0000400000, "rw-p", "0", ""}, true, true},
		{"55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]", true, Mapping{0x55d0c0a00000, 0x55d0c0a21000, "rw-p", "0", "[heap]"}, true, true},
		{"7f1000000000-7f1000001000 rw-p 00000000 00:00 0   [anon:jit cache]", true, Mapping{0x7f1000000000, 0x7f1000001000, "rw-p", "0", "[anon:jit cache]"}, true, true},
		{"7f2000000000-7f2000001000 rw-s 00000000 00:01 1044  /dev/zero (deleted)", true, Mapping{0x7f2000000000, 0x7f2000001000, "rw-s", "1044", "/dev/zero (deleted)"}, false, true},
		{"400000-401000 r-xp 00000000 08:01 131  /opt/my app/bin", true, Mapping{0x400000, 0x401000, "r-xp", "131", "/opt/my app/bin"}, false, false},
		{"7f3000000000-7f3000001000 rw-p 00000000 fd:00 77  /var/lib/data", true, Mapping{0x7f3000000000, 0x7f3000001000, "rw-p", "77", "/var/lib/data"}, false, true},
		{"Rss:                 128 kB", false, Mapping{}, false, false},
		{"VmFlags: rd wr mr mw me ac sd", false, Mapping{}, false, false},
		{"", false, Mapping{}, false, false},
		{"zz-10 rw-p 0 0:0 0", false, Mapping{}, false, false},
	} {
		m, ok := ParseMapping(c.line)
		if ok != c.ok || m != c.want {
			t.Errorf("ParseMapping(%q) = %+v, %v; want %+v, %v", c.line, m, ok, c.want, c.ok)
			continue
		}
		if ok && (m.PrivateAnonymous() != c.privAnon || m.Writable() != c.writeable) {
			t.Errorf("%q: private anonymous %v, writable %v; want %v, %v", c.line, m.PrivateAnonymous(), m.Writable(), c.privAnon, c.writeable)
		}
	}
}

// This process's own maps parse whole: every line a mapping, in address order.
func TestReadMapsOfThisProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := ParseMaps(b)
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, c := range b {
		if c == '\n' {
			lines++
		}
	}
	if len(ms) != lines {
		t.Fatalf("%d mappings from %d lines", len(ms), lines)
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].Start < ms[i-1].End {
			t.Fatalf("mapping %d (%#x) starts before %d ends (%#x)", i, ms[i].Start, i-1, ms[i-1].End)
		}
	}
	if _, err := ReadMaps(fmt.Sprintf("/proc/%d/maps", 1<<30)); err == nil {
		t.Fatal("maps of a PID that cannot exist read without error")
	}
}
