package criuimg

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/beneath"
)

// RearmExpiredTimerfds repairs, in the images CRIU just dumped into dir, every periodic
// timerfd that had expired without being read when its process was frozen, and returns how
// many it repaired.
//
// CRIU records a timerfd from /proc/PID/fdinfo, whose it_value is the time left to the
// next expiry; the kernel forwards an expired periodic timer only when it is read (or asked
// with timerfd_gettime), so a timer that expired while CRIU held its process frozen reads
// it_value (0, 0) with its ticks pending. CRIU restores that value with timerfd_settime,
// where (0, 0) disarms the timer: the restored process read its pending ticks and then
// blocked for good on a timer that never fired again (hostile test: a 1 s timerfd loop
// stopped after every second gpucr checkpoint, whose freeze lasts as long as the network
// lock, half a second here, and seconds with a GPU). The timer is armed again to its next
// interval, its pending ticks kept.
func RearmExpiredTimerfds(dir string) (int, error) {
	const name = "files.img"
	entries, err := decode(newBudget(), beneath.FS(dir), name, &fdinfo.FileEntry{})
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // nothing open anywhere
	}
	if err != nil {
		return 0, err
	}
	repaired := 0
	for _, e := range entries {
		if t := e.GetTfd(); e.GetType() == fdinfo.FdTypes_TIMERFD && t != nil &&
			t.GetTicks() > 0 && t.GetVsec() == 0 && t.GetVnsec() == 0 && (t.GetIsec() != 0 || t.GetInsec() != 0) {
			t.Vsec, t.Vnsec = proto.Uint64(t.GetIsec()), proto.Uint64(t.GetInsec())
			repaired++
		}
	}
	if repaired == 0 {
		return 0, nil
	}
	if err := rewrite(filepath.Join(dir, name), entries); err != nil {
		return 0, err
	}
	return repaired, nil
}

// rewrite replaces the files image at path with entries, written aside, synced and renamed
// over it with its mode.
func rewrite(path string, entries []*fdinfo.FileEntry) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	tmp := path + ".gpucr-rewrite"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return fmt.Errorf("rewrite %s: %w", filepath.Base(path), err)
	}
	w := bufio.NewWriter(f)
	iw, err := newImageWriter(w, filesMagic, filepath.Base(path))
	for i := 0; err == nil && i < len(entries); i++ {
		err = iw.entry(entries[i])
	}
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rewrite %s: %w", filepath.Base(path), err)
	}
	return nil
}
