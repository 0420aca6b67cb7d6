package engine

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	remap_file_path "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/proctree"
)

// writeCRIUImage writes entries as CRIU's image name in dir, under CRIU's magics.
func writeCRIUImage(t *testing.T, dir, name string, magic uint32, entries ...proto.Message) {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, 0x54564319) // CRIU's common magic
	b = binary.LittleEndian.AppendUint32(b, magic)
	for _, m := range entries {
		e, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b = append(binary.LittleEndian.AppendUint32(b, uint32(len(e))), e...)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint that fails after CRIU made its links removes them all: it returned on the
// first error with them in /dev/shm, and the next checkpoint of a job alike failed in CRIU
// on the name taken (review).
func TestFailedRecordRemovesCRIUsLinks(t *testing.T) {
	criuDir := t.TempDir()
	link := "/dev/shm/link_remap.9" + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(link, make([]byte, 32), 0o600); err != nil {
		t.Skip("no /dev/shm here: " + err.Error())
	}
	t.Cleanup(func() { os.Remove(link) })
	id := uint32(5)
	linked := remap_file_path.RemapType_LINKED
	writeCRIUImage(t, criuDir, "remap-fpath.img", 0x59133954,
		&remap_file_path.RemapFilePathEntry{OrigId: proto.Uint32(1), RemapId: &id, RemapType: &linked})
	reg := fdinfo.FdTypes_REG
	writeCRIUImage(t, criuDir, "files.img", 0x56303138,
		&fdinfo.FileEntry{Type: &reg, Id: &id, Reg: &regfile.RegFileEntry{Id: &id, Flags: proto.Uint32(0), Pos: proto.Uint64(0),
			Name: proto.String(link[1:]), Fown: &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)}}})
	// The link is to no semaphore of the (empty) tree: the record fails.
	if _, err := linkedFiles(criuDir, proctree.Snap("/proc", nil)); err == nil {
		t.Fatal("a link to none of the tree's semaphores was recorded")
	}
	if _, err := os.Lstat(link); err == nil {
		t.Fatalf("the failed record left CRIU's link %s", link)
	}
}
