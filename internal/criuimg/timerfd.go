package criuimg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	fsys := beneath.FS(dir)
	head, err := imageHead(fsys, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // nothing open anywhere
	}
	if err != nil {
		return 0, err
	}
	var frames [][]byte
	repaired := 0
	err = eachFrame(newBudget(), fsys, name, 0, func(b []byte) error {
		frame := append([]byte(nil), b...)
		var e fdinfo.FileEntry
		if err := proto.Unmarshal(b, &e); err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if t := e.GetTfd(); e.GetType() == fdinfo.FdTypes_TIMERFD && t != nil &&
			t.GetTicks() > 0 && t.GetVsec() == 0 && t.GetVnsec() == 0 && (t.GetIsec() != 0 || t.GetInsec() != 0) {
			t.Vsec, t.Vnsec = proto.Uint64(t.GetIsec()), proto.Uint64(t.GetInsec())
			if frame, err = proto.Marshal(&e); err != nil {
				return fmt.Errorf("encode %s: %w", name, err)
			}
			repaired++
		}
		frames = append(frames, frame)
		return nil
	})
	if err != nil || repaired == 0 {
		return 0, err
	}
	if err := rewrite(filepath.Join(dir, name), head, frames); err != nil {
		return 0, err
	}
	return repaired, nil
}

// imageHead returns the magics image name starts with: the common one, if any, and its own.
func imageHead(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var b [8]byte
	if _, err := io.ReadFull(f, b[:4]); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	m := binary.LittleEndian.Uint32(b[:4])
	if m != imgCommonMagic && m != imgServiceMagic {
		return b[:4], nil
	}
	if _, err := io.ReadFull(f, b[4:]); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return b[:], nil
}

// rewrite replaces the image at path with head and frames, framed as CRIU frames them,
// written aside, synced and renamed over it with its mode.
func rewrite(path string, head []byte, frames [][]byte) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	tmp := path + ".gpucr-rewrite"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return fmt.Errorf("rewrite %s: %w", filepath.Base(path), err)
	}
	buf := append([]byte(nil), head...)
	for _, fr := range frames {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(len(fr)))
		buf = append(buf, fr...)
	}
	_, err = f.Write(buf)
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
