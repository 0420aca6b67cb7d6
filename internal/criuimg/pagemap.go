package criuimg

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"
)

// PageSize is the unit of CRIU's runs of pages: gpucr checkpoints x86-64 and arm64 with
// 4 KiB pages.
const PageSize = 4096

// The flags of a pagemap entry (criu/include/pagemap.h).
const (
	PEParent  = 1 << 0 // the pages are in the parent image
	PELazy    = 1 << 1 // the pages may be restored lazily, from a page server
	PEPresent = 1 << 2 // the pages are in the pages file
)

// Pagemap is a pagemap image: the head, which names the pages file, and the runs of pages,
// in the order their present pages follow one another in that file.
type Pagemap struct {
	Head    *pagemap.PagemapHead
	Entries []*pagemap.PagemapEntry
}

// PagesName is the pages file that holds the pagemap's present pages.
func (m *Pagemap) PagesName() string { return PagesName(m.Head.GetPagesId()) }

// ReadPagemap reads the pagemap image at path. The image comes from a checkpoint, which
// anyone can write: its frames are checked before they are decoded, and an image without
// a head is refused.
func ReadPagemap(path string) (*Pagemap, error) {
	return readPagemap(newBudget(), os.DirFS(filepath.Dir(path)), filepath.Base(path))
}

// ReadPagemapFS is ReadPagemap of the pagemap image name in fsys: files held open, say.
func ReadPagemapFS(fsys fs.FS, name string) (*Pagemap, error) {
	return readPagemap(newBudget(), fsys, name)
}

// readPagemap reads the pagemap image name in fsys: its first entry is the head.
func readPagemap(n *budget, fsys fs.FS, name string) (*Pagemap, error) {
	var m *Pagemap
	err := eachFrame(n, fsys, name, pagemapMagic, func(b []byte) error {
		var entry proto.Message
		if m == nil {
			m = &Pagemap{Head: &pagemap.PagemapHead{}}
			entry = m.Head
		} else {
			e := &pagemap.PagemapEntry{}
			m.Entries, entry = append(m.Entries, e), e
		}
		return n.unmarshal(name, b, entry)
	})
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("read %s: no pagemap head", name)
	}
	return m, nil
}

// Present says whether the pages of e are in the pages file. An entry without flags was
// written by a CRIU older than them, which CRIU still reads as present unless it is marked
// as in the parent image (init_compat_pagemap_entry in criu/pagemap.c).
func Present(e *pagemap.PagemapEntry) bool {
	if e.Flags == nil {
		return !e.GetInParent()
	}
	return e.GetFlags()&PEPresent != 0
}

// WritePagemap writes m as a new pagemap image at path.
func WritePagemap(path string, m *Pagemap) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	w := bufio.NewWriter(f)
	pw, err := NewPagemapWriter(w, m.Head)
	for _, e := range m.Entries {
		if err != nil {
			break
		}
		err = pw.Add(e)
	}
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// PagemapWriter writes a pagemap image an entry at a time, as CRIU writes one, so that the
// page server can record each run of pages as CRIU sends it.
type PagemapWriter struct{ iw *imageWriter }

// NewPagemapWriter starts a pagemap image with head on w.
func NewPagemapWriter(w io.Writer, head *pagemap.PagemapHead) (*PagemapWriter, error) {
	iw, err := newImageWriter(w, pagemapMagic, "pagemap")
	if err != nil {
		return nil, err
	}
	if err := iw.entry(head); err != nil {
		return nil, err
	}
	return &PagemapWriter{iw}, nil
}

// Add appends the run of pages e.
func (pw *PagemapWriter) Add(e *pagemap.PagemapEntry) error { return pw.iw.entry(e) }

// imageWriter writes a CRIU image as CRIU frames one: the common magic and the image's own,
// then each entry's size in 32 bits and the entry.
type imageWriter struct {
	w    io.Writer
	what string // the image, as errors name it
}

func newImageWriter(w io.Writer, magic uint32, what string) (*imageWriter, error) {
	var magics [8]byte
	binary.LittleEndian.PutUint32(magics[0:], imgCommonMagic)
	binary.LittleEndian.PutUint32(magics[4:], magic)
	if _, err := w.Write(magics[:]); err != nil {
		return nil, fmt.Errorf("write %s magic: %w", what, err)
	}
	return &imageWriter{w: w, what: what}, nil
}

// entry appends m.
func (iw *imageWriter) entry(m proto.Message) error {
	frame, err := proto.MarshalOptions{}.MarshalAppend(make([]byte, 4, 4+proto.Size(m)), m)
	if err != nil {
		return fmt.Errorf("encode %s entry: %w", iw.what, err)
	}
	binary.LittleEndian.PutUint32(frame, uint32(len(frame)-4))
	if _, err := iw.w.Write(frame); err != nil {
		return fmt.Errorf("write %s entry: %w", iw.what, err)
	}
	return nil
}
