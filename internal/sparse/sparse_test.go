package sparse

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A section of a file of data, a hole and data, copied to another place in a new file:
// the same bytes there, and its hole a hole (the copy takes the data's room only).
func TestCopyLeavesHolesHoles(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	in, err := os.Create(filepath.Join(dir, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	data := bytes.Repeat([]byte{7}, mib)
	for _, at := range []int64{0, 9 * mib} { // a hole of 8 MiB between
		if _, err := in.WriteAt(data, at); err != nil {
			t.Fatal(err)
		}
	}
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	const at = 3 * mib
	if err := Copy(in, out, mib/2, at, 9*mib); err != nil { // half of each run of data
		t.Fatal(err)
	}
	if err := out.Truncate(at + 9*mib); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, at+9*mib)
	copy(want[at:], data[:mib/2])
	copy(want[at+mib/2+8*mib:], data[:mib/2])
	if !bytes.Equal(got, want) {
		t.Fatal("the copy's bytes are not the section's")
	}
	if got := Data(in, mib/2, 9*mib); got > 2*mib || got < mib {
		t.Errorf("Data of the section: %d bytes, want its 1 MiB of data (or a block more)", got)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(out.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 2*mib {
		t.Errorf("the copy takes %d bytes of disk for 1 MiB of data: its hole was written", st.Blocks*512)
	}
}

// Fewer bytes than asked is an error: a file that shrank while it was copied came out
// padded with zeros, and sealed as it was (review).
func TestCopyRangeOfAShortFileFails(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(short)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := CopyRange(in, out, 0, 0, 2<<20); err == nil {
		t.Error("a copy of 2 MiB from a file of 1 MiB succeeded")
	}
}
