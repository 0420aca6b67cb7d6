// Package sparse copies the data of files and leaves their holes holes: an image's page
// files are holes where memory was zeros, and a crafted one, copied byte for byte, fills
// whatever disk it is copied to.
package sparse

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Data is how many of the n bytes of f from off are data, not holes: what a Copy of them
// writes, at most. A file system that cannot tell has them all be data.
func Data(f *os.File, off, n int64) int64 {
	var total int64
	_ = eachRun(f, off, n, func(data, end int64) error {
		total += end - data
		return nil
	})
	return total
}

// Copy copies the n bytes of in at inOff to out at outOff, copying only in's runs of data:
// out's bytes there must be holes already (a new file, not yet as long). A file system that
// cannot tell data from holes has it all copied.
func Copy(in, out *os.File, inOff, outOff, n int64) error {
	return eachRun(in, inOff, n, func(data, end int64) error {
		return CopyRange(in, out, data, outOff+data-inOff, end-data)
	})
}

// eachRun calls use with each run of data [data, end) in the n bytes of f from off, in
// order; a file system that cannot tell data from holes has all of them be one run.
func eachRun(f *os.File, off, n int64, use func(data, end int64) error) error {
	end := off + n
	for off < end {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // holes to the end
		}
		hole := end
		if err != nil {
			data = off
		} else if hole, err = unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE); err != nil {
			hole = end
		}
		data, hole = min(data, end), min(hole, end)
		if data < hole {
			if err := use(data, hole); err != nil {
				return err
			}
		}
		off = max(hole, data+1)
	}
	return nil
}

// CopyRange copies the n bytes of in at inOff to out at outOff: in the kernel
// (copy_file_range), or through memory where it cannot (file systems of two kinds, an old
// kernel, a seccomp filter). Fewer bytes than asked is an error: a file that shrank while
// copied came out padded with zeros, and sealed as it was (review).
func CopyRange(in, out *os.File, inOff, outOff, n int64) error {
	r, w := inOff, outOff
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &r, int(out.Fd()), &w, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			copied, err := io.Copy(io.NewOffsetWriter(out, w), io.NewSectionReader(in, r, n))
			if err == nil && copied < n {
				err = fmt.Errorf("%d bytes at %d were not there: the file changed while it was copied", n-copied, r+copied)
			}
			return err
		}
		n -= int64(c)
	}
	return nil
}
