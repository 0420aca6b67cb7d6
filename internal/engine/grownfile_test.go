package engine

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/testutil"
)

// Truncating is offered only for a file the job held open write-only, its output, and that
// grew: a library, a program, or data the job reads or updates (a database opened
// read-write) that changed size must be put back, and truncating it would restore the job
// onto the wrong bytes; an output that shrank (rotated, truncated by someone) would be
// padded with zeros (review).
func TestHintGrownFileOffersTruncateForOutputOnly(t *testing.T) {
	u32 := proto.Uint32
	owner := &fown.FownEntry{Uid: u32(0), Euid: u32(0), Signum: u32(0), PidType: u32(0), Pid: u32(0)}
	reg := func(id, flags uint32, name string) proto.Message {
		return &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(id), Reg: &regfile.RegFileEntry{
			Id: u32(id), Flags: u32(flags), Pos: proto.Uint64(0), Fown: owner, Name: proto.String(name)}}
	}
	dir := t.TempDir()
	testutil.WriteFile(t, filepath.Join(dir, "files.img"), fuzzcheck.Image(t, "FILES",
		reg(1, 01|01000, "/srv/job.out"), reg(2, 0, "/srv/data.bin"), reg(3, 02, "/srv/state.db")))
	for _, c := range []struct {
		name     string
		size     int
		truncate bool
	}{{"srv/job.out", 56, true}, {"srv/state.db", 56, false}, {"srv/data.bin", 56, false}, {"usr/lib/libx.so", 56, false},
		{"srv/job.out", 10, false}} {
		line := fmt.Sprintf("(00.01) Error (criu/files-reg.c:2175): File %s has bad size %d (expect 23)", c.name, c.size)
		err := &criu.Error{Op: "restore", LogPath: "/w/restore.log", Lines: []string{line}, Err: errors.New("exit status 1")}
		HintGrownFile(err, dir, false)
		msg := err.Error()
		offered := strings.Contains(msg, "truncate -s 23 /"+c.name)
		if offered != c.truncate || !strings.Contains(msg, "23 bytes then") {
			t.Errorf("%s at %d bytes: %q; truncate offered %v, want %v", c.name, c.size, msg, offered, c.truncate)
		}
	}
}

// The file's name is the job's, chosen by its user: printed bare in the truncate command, a
// name with a space in it ("/home/u/x /etc/shadow", a directory "x " holding etc/shadow)
// had root, pasting the hint, truncate /etc/shadow too (hostile test).
func TestHintGrownFileQuotesTheName(t *testing.T) {
	u32 := proto.Uint32
	owner := &fown.FownEntry{Uid: u32(0), Euid: u32(0), Signum: u32(0), PidType: u32(0), Pid: u32(0)}
	names := []string{"/home/u/x /etc/shadow", "/home/u/it's; rm -rf ~", "/home/u/$(id)`id`"}
	var entries []proto.Message
	for i, n := range names {
		entries = append(entries, &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(uint32(i + 1)), Reg: &regfile.RegFileEntry{
			Id: u32(uint32(i + 1)), Flags: u32(01), Pos: proto.Uint64(0), Fown: owner, Name: proto.String(n)}})
	}
	dir := t.TempDir()
	testutil.WriteFile(t, filepath.Join(dir, "files.img"), fuzzcheck.Image(t, "FILES", entries...))
	want := []string{`truncate -s 0 '/home/u/x /etc/shadow')`, `truncate -s 0 '/home/u/it'\''s; rm -rf ~')`, "truncate -s 0 '/home/u/$(id)`id`')"}
	for i, n := range names {
		line := fmt.Sprintf("(00.01) Error (criu/files-reg.c:2175): File %s has bad size 9 (expect 0)", n[1:])
		err := &criu.Error{Op: "restore", LogPath: "/w/restore.log", Lines: []string{line}, Err: errors.New("exit status 1")}
		HintGrownFile(err, dir, false)
		if msg := err.Error(); !strings.Contains(msg, want[i]) {
			t.Errorf("%q: %q, want it to hold %q", n, msg, want[i])
		}
	}
	if got := ShellWord("/srv/job-1.out"); got != "/srv/job-1.out" {
		t.Errorf("ShellWord(/srv/job-1.out) = %q, want it bare", got)
	}
}
