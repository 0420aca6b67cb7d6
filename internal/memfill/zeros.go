package memfill

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criuimg"
)

// zeroBlock is the size of the blocks of zeros the fill looks for: a run of them that lands
// in pages the process has never touched is not written.
const zeroBlock = 64 << 10

var zeros = make([]byte, zeroBlock)

// Bits of a /proc/PID/pagemap entry (Documentation/admin-guide/mm/pagemap.rst): a page in
// memory, or swapped out, holds what was written to it; one neither reads as zeros in
// private anonymous memory.
const (
	pagePresent = 1 << 63
	pageSwapped = 1 << 62
)

// pagemaps are the /proc/PID/pagemap files of the processes a fill writes into, opened
// as the fill first needs each.
type pagemaps struct {
	mu    sync.Mutex
	files map[int]*os.File
}

func (pm *pagemaps) open(pid int) *os.File {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	f, ok := pm.files[pid]
	if !ok {
		f, _ = os.Open(fmt.Sprintf("/proc/%d/pagemap", pid)) // nil: every zero is written
		if pm.files == nil {
			pm.files = map[int]*os.File{}
		}
		pm.files[pid] = f
	}
	return f
}

func (pm *pagemaps) close() {
	for _, f := range pm.files {
		if f != nil {
			f.Close()
		}
	}
}

// untouched reports, for each zeroBlock of pid's memory from addr to addr+n, whether none
// of its pages is present or swapped out; nil if it cannot tell (then all is written).
func (pm *pagemaps) untouched(pid int, addr uint64, n int) []bool {
	f := pm.open(pid)
	if f == nil || addr%criuimg.PageSize != 0 {
		return nil
	}
	entries := make([]byte, 8*((n+criuimg.PageSize-1)/criuimg.PageSize))
	if _, err := f.ReadAt(entries, int64(addr/criuimg.PageSize*8)); err != nil {
		return nil
	}
	const perBlock = zeroBlock / criuimg.PageSize
	out := make([]bool, (len(entries)/8+perBlock-1)/perBlock)
	for i := range out {
		out[i] = true
	}
	for i := 0; i < len(entries); i += 8 {
		if binary.LittleEndian.Uint64(entries[i:])&(pagePresent|pageSwapped) != 0 {
			out[i/8/perBlock] = false
		}
	}
	return out
}

// zeroAt reports whether the block of data at off holds only zeros.
func zeroAt(data []byte, off int) bool {
	b := data[off:min(off+zeroBlock, len(data))]
	return bytes.Equal(b, zeros[:len(b)])
}

// writeSparse writes data into pid's private anonymous memory at addr, as moveRemote does,
// but leaves out the runs of zero blocks whose pages pid has never touched: they read as
// zeros already, and writing them would only allocate them.
func writeSparse(pm *pagemaps, pid int, addr uint64, data []byte) (skipped int64, err error) {
	from := 0 // data before from is written or left out
	for at := 0; at < len(data); {
		if !zeroAt(data, at) {
			at += zeroBlock
			continue
		}
		end := at
		for end < len(data) && zeroAt(data, end) {
			end = min(end+zeroBlock, len(data))
		}
		fresh := pm.untouched(pid, addr+uint64(at), end-at)
		for i, b := range fresh {
			if !b {
				continue
			}
			lo, hi := at+i*zeroBlock, min(at+(i+1)*zeroBlock, end)
			if err := moveRemote(unix.ProcessVMWritev, "memory fill: write", pid, addr+uint64(from), data[from:lo]); err != nil {
				return skipped, err
			}
			from, skipped = hi, skipped+int64(hi-lo)
		}
		at = end
	}
	return skipped, moveRemote(unix.ProcessVMWritev, "memory fill: write", pid, addr+uint64(from), data[from:])
}
