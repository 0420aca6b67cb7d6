package criuimg

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timerfd"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/testutil"
)

// Only a periodic timer that expired unread is armed again, to its interval, its pending
// ticks kept; every other entry of files.img is left as CRIU wrote it, and an image with
// none to mend is not rewritten.
func TestRearmExpiredTimerfdsMendsOnlyExpiredPeriodicTimers(t *testing.T) {
	u32, u64 := proto.Uint32, proto.Uint64
	owner := &fown.FownEntry{Uid: u32(0), Euid: u32(0), Signum: u32(0), PidType: u32(0), Pid: u32(0)}
	timer := func(id uint32, ticks, vsec, isec uint64) *fdinfo.FileEntry {
		return &fdinfo.FileEntry{Type: fdinfo.FdTypes_TIMERFD.Enum(), Id: u32(id), Tfd: &timerfd.TimerfdEntry{
			Id: u32(id), Flags: u32(0), Fown: owner, Clockid: u32(1), Ticks: u64(ticks), SettimeFlags: u32(0),
			Vsec: u64(vsec), Vnsec: u64(0), Isec: u64(isec), Insec: u64(0)}}
	}
	reg := &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(1), Reg: &regfile.RegFileEntry{
		Id: u32(1), Flags: u32(0), Pos: u64(0), Fown: owner, Name: proto.String("/data")}}
	expired, oneShot, armed := timer(2, 3, 0, 1), timer(3, 1, 0, 0), timer(4, 0, 5, 1)

	dir := t.TempDir()
	testutil.WriteFile(t, filepath.Join(dir, "files.img"), fuzzcheck.Image(t, "FILES", reg, expired, oneShot, armed))
	n, err := RearmExpiredTimerfds(dir)
	if err != nil || n != 1 {
		t.Fatalf("RearmExpiredTimerfds = %d, %v; want 1 mended", n, err)
	}
	got, err := decode(newBudget(), os.DirFS(dir), "files.img", &fdinfo.FileEntry{})
	if err != nil || len(got) != 4 {
		t.Fatalf("files.img after: %d entries, %v", len(got), err)
	}
	mended := proto.Clone(expired).(*fdinfo.FileEntry)
	mended.Tfd.Vsec = u64(1)
	for i, want := range []proto.Message{reg, mended, oneShot, armed} {
		if !proto.Equal(got[i], want) {
			t.Errorf("entry %d: %v, want %v", i, got[i], want)
		}
	}

	before, err := os.Stat(filepath.Join(dir, "files.img"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := RearmExpiredTimerfds(dir); err != nil || n != 0 {
		t.Fatalf("a second pass: %d, %v; want nothing to mend", n, err)
	}
	if after, _ := os.Stat(filepath.Join(dir, "files.img")); !os.SameFile(before, after) {
		t.Error("files.img was rewritten with nothing to mend")
	}
}
