package chunked

import (
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// pageCuts returns, for each pages-<id>.img of a CRIU image, where its chunks end. CRIU
// writes the pages of a process back to back in address order, so a page's offset in the
// file moves whenever any run of pages before it grows or shrinks, as a heap does between
// two checkpoints; chunks cut at fixed file offsets would then all differ. Cutting instead
// where the pages' virtual address crosses a ChunkSize boundary makes a chunk the pages of
// one aligned window of address space, which is the same bytes in the next checkpoint
// when that memory did not change. Files whose pagemap cannot be read, or does not account
// for the file's size exactly, are left out and get fixed-size chunks. The pagemaps are
// read from the files held: by their paths, a FIFO swapped in after verification held the
// push for good (review).
func pageCuts(held *heldFiles, files []File) map[string][]int64 {
	sizes := map[string]int64{}
	var largest int64
	for _, f := range files {
		sizes[f.Path] = f.Size
		largest = max(largest, f.Size)
	}
	cuts := map[string][]int64{}
	for _, rel := range held.paths {
		if ok, _ := path.Match(image.CRIUDir+"/"+criuimg.PagemapGlob, rel); !ok {
			continue
		}
		id, ends, err := chunkEnds(heldFS{held}, rel, largest)
		if err != nil {
			continue
		}
		name := image.CRIUDir + "/" + criuimg.PagesName(id)
		if size, ok := sizes[name]; ok && (len(ends) == 0 && size == 0 || len(ends) > 0 && ends[len(ends)-1] == size) {
			cuts[name] = ends
		}
	}
	return cuts
}

// heldFS serves held files by their slash-separated paths, read from their descriptors.
type heldFS struct{ h *heldFiles }

func (h heldFS) Open(name string) (fs.File, error) {
	i := slices.Index(h.h.paths, name)
	if i < 0 {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	f := h.h.files[i]
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return &heldFile{io.NewSectionReader(f, 0, fi.Size()), fi}, nil
}

// heldFile reads a held file from its start; closing it leaves the file held.
type heldFile struct {
	*io.SectionReader
	fi fs.FileInfo
}

func (f *heldFile) Stat() (fs.FileInfo, error) { return f.fi, nil }
func (f *heldFile) Close() error               { return nil }

// chunkEnds returns the pages id of a pagemap image and the file offsets at which the
// chunks of its pages file end. The present pages must add up to limit bytes at most: the
// pagemap comes from the image, and each of its entries can claim 16 TiB of pages, which
// would otherwise be walked page by page.
func chunkEnds(fsys fs.FS, name string, limit int64) (uint32, []int64, error) {
	pm, err := criuimg.ReadPagemapFS(fsys, name)
	if err != nil {
		return 0, nil, err
	}
	var (
		ends   []int64
		off    int64
		window = int64(-1)
	)
	for _, e := range pm.Entries {
		if !criuimg.Present(e) {
			continue
		}
		if int64(e.GetNrPages())*criuimg.PageSize > limit-off {
			return 0, nil, fmt.Errorf("%s: its pages add up to more than %d bytes", name, limit)
		}
		for p := range int64(e.GetNrPages()) {
			w := (int64(e.GetVaddr()) + p*criuimg.PageSize) / ChunkSize
			if w != window && off > 0 {
				ends = append(ends, off)
			}
			window = w
			off += criuimg.PageSize
		}
	}
	if off > 0 {
		ends = append(ends, off)
	}
	// Pages out of address order, or listed twice, make one window's chunk longer than a
	// chunk can be: a push's buffers hold ChunkSize, and such a pagemap crashed it (review).
	var prev int64
	for _, end := range ends {
		if end-prev > ChunkSize {
			return 0, nil, fmt.Errorf("%s: its pages are not in address order", name)
		}
		prev = end
	}
	return pm.Head.GetPagesId(), ends, nil
}
