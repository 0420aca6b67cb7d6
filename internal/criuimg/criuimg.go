// Package criuimg reads what is inside a CRIU image directory (process tree, memory, open
// files) for `gpucr inspect`. It only reads.
package criuimg

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
)

// Summary is an image's process tree with each process's memory and files.
type Summary struct {
	Processes   []Process `json:"processes"`
	MemoryBytes uint64    `json:"memoryBytes"` // dumped pages
}

// Process is one process of the image, in tree order.
type Process struct {
	PID         int        `json:"pid"`
	PPID        int        `json:"ppid"`
	Command     string     `json:"command"`
	Threads     int        `json:"threads"`
	MemoryBytes uint64     `json:"memoryBytes"`
	Files       []OpenFile `json:"files"`
}

// OpenFile is one descriptor of a process.
type OpenFile struct {
	FD   int    `json:"fd"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// Read summarizes the CRIU images in dir.
func Read(dir string) (*Summary, error) {
	c := crit.New(nil, nil, dir, false, true)
	root, err := c.ExplorePs()
	if err != nil {
		return nil, fmt.Errorf("read process tree in %s: %w", dir, err)
	}
	files := map[int][]OpenFile{}
	if fds, err := c.ExploreFds(); err == nil {
		for _, fd := range fds {
			for _, f := range fd.Files {
				n, err := strconv.Atoi(f.Fd)
				if err != nil {
					n = -1 // cwd and root are listed by name
				}
				files[int(fd.PId)] = append(files[int(fd.PId)], OpenFile{FD: n, Type: f.Type, Path: f.Path})
			}
		}
	}
	s := &Summary{}
	var walk func(t *crit.PsTree, ppid int) error
	walk = func(t *crit.PsTree, ppid int) error {
		mem, err := pagesBytes(filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", t.PID)))
		if err != nil {
			return err
		}
		threads := 1
		if t.Process != nil && len(t.Process.GetThreads()) > 0 {
			threads = len(t.Process.GetThreads())
		}
		s.Processes = append(s.Processes, Process{
			PID: int(t.PID), PPID: ppid, Command: t.Comm, Threads: threads, MemoryBytes: mem, Files: files[int(t.PID)],
		})
		s.MemoryBytes += mem
		kids := append([]*crit.PsTree(nil), t.Children...)
		sort.Slice(kids, func(i, j int) bool { return kids[i].PID < kids[j].PID })
		for _, k := range kids {
			if err := walk(k, int(t.PID)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root, 0); err != nil {
		return nil, err
	}
	return s, nil
}

// pagesBytes sums a pagemap image's entries: the pages CRIU wrote for one process.
func pagesBytes(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", filepath.Base(path), err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, true).Decode(&pagemap.PagemapEntry{})
	if err != nil {
		return 0, fmt.Errorf("decode %s: %w", filepath.Base(path), err)
	}
	var pages uint64
	for _, e := range img.Entries {
		if pe, ok := e.Message.(*pagemap.PagemapEntry); ok {
			pages += uint64(pe.GetNrPages())
		}
	}
	return pages * uint64(os.Getpagesize()), nil
}
