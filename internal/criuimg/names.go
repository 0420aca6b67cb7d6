package criuimg

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

// The names of CRIU's memory images (criu/image-desc.c): a pagemap per process and per
// shared-memory segment, each naming in its head the pages file that holds its pages.
const (
	// PagemapGlob matches every pagemap image, of processes and of shared memory alike.
	PagemapGlob = "pagemap-*.img"
	// PagesGlob matches every pages file.
	PagesGlob = "pages-*.img"
)

// PagemapName is the pagemap image of process pid.
func PagemapName(pid int) string { return fmt.Sprintf("pagemap-%d.img", pid) }

// ShmemPagemapName is the pagemap image of the shared-memory segment shmid.
func ShmemPagemapName(shmid uint64) string { return fmt.Sprintf("pagemap-shmem-%d.img", shmid) }

// PagesName is the pages file whose id a pagemap head names.
func PagesName(id uint32) string { return fmt.Sprintf("pages-%d.img", id) }

// IsPagesName says whether the base name name is a pages file: raw memory, which CRIU
// copies without parsing it.
func IsPagesName(name string) bool {
	ok, _ := path.Match(PagesGlob, name) // the pattern is well formed: no error
	return ok
}

// MemDir is the directory of an image that holds the memory gpucr saves itself, beside
// CRIU's images: one file per segment of a saved range, named by MemName, holding its bytes.
const MemDir = "mem"

// MemName is the file in MemDir of the segment of process pid's memory that starts at
// address start, pid as the image numbers the process: PID-START.img, START in hexadecimal.
func MemName(pid int, start uint64) string { return fmt.Sprintf("%d-%x.img", pid, start) }

// ParseMemName reads back the process and address a MemName names; ok is false for any
// other name. The name comes from the image's manifest, which anyone can write.
func ParseMemName(name string) (pid int, start uint64, ok bool) {
	base, img := strings.CutSuffix(name, ".img")
	pidS, startS, cut := strings.Cut(base, "-")
	pid, err1 := strconv.Atoi(pidS)
	start, err2 := strconv.ParseUint(startS, 16, 64)
	if !img || !cut || err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return pid, start, true
}
