package criuimg

import (
	"fmt"
	"path"
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
