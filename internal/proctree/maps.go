package proctree

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Mapping is one mapping of a process's memory, as a line of /proc/PID/maps (or the first
// line of a mapping in smaps) gives it.
type Mapping struct {
	Start, End uint64
	Perms      string // "rw-p": read, write, execute, then p(rivate) or s(hared)
	Inode      string // "0" for memory no file backs
	Path       string // "" for anonymous memory, "[heap]", "[anon:NAME]"; may hold spaces
}

// ParseMapping parses a maps line: "start-end perms offset dev inode", then spaces and the
// path. ok is false for any other line (smaps' fields).
func ParseMapping(line string) (m Mapping, ok bool) {
	rest := line
	var field [5]string
	for i := range field {
		field[i], rest, _ = strings.Cut(strings.TrimLeft(rest, " "), " ")
	}
	lo, hi, found := strings.Cut(field[0], "-")
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if !found || err1 != nil || err2 != nil || len(field[1]) != 4 || field[4] == "" {
		return Mapping{}, false
	}
	return Mapping{Start: start, End: end, Perms: field[1], Inode: field[4], Path: strings.TrimLeft(rest, " ")}, true
}

// Writable says whether the process may write the mapping.
func (m Mapping) Writable() bool { return m.Perms[1] == 'w' }

// Private says whether writes to the mapping change only this process's memory (copied
// on write from its file, if any): a write through a shared mapping lands in a file or in
// memory others see.
func (m Mapping) Private() bool { return m.Perms[3] == 'p' }

// PrivateAnonymous says whether the mapping is private memory no file backs: a page of it
// never touched reads as zeros, and no other process sees it.
func (m Mapping) PrivateAnonymous() bool {
	return m.Perms[3] == 'p' && m.Inode == "0" && (m.Path == "" || m.Path == "[heap]" || strings.HasPrefix(m.Path, "[anon:"))
}

// ParseMaps parses a whole maps file, in its order (by address).
func ParseMaps(b []byte) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20) // a path is at most PATH_MAX, but may be escaped
	for sc.Scan() {
		if m, ok := ParseMapping(sc.Text()); ok {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// ReadMaps reads the maps file at path (/proc/PID/maps, or under another procfs).
func ReadMaps(path string) ([]Mapping, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseMaps(b)
}
