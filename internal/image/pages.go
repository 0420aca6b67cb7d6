package image

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

// PagesFile is one of CRIU's page files written into a staged image as gpucr's page server
// receives it. Each HashChunkSize piece is written and checksummed by a pool of workers while
// the next ones arrive, so the file is never read back for its checksum and CRIU's one
// sending thread is the only sequential part.
type PagesFile struct {
	s       *Staging
	rel     string // slash path in the image
	f       *os.File
	buf     []byte // the piece being filled
	off     int64  // file offset of buf
	mu      sync.Mutex
	pieces  []Piece
	err     error // the first write error
	pending sync.WaitGroup
	closed  bool
}

// pagesPool is the staging's workers and piece buffers, started with the first PagesFile.
type pagesPool struct {
	work chan pagesJob
	free chan []byte
	wg   sync.WaitGroup
}

type pagesJob struct {
	p     *PagesFile
	index int
	off   int64
	data  []byte
}

func (s *Staging) pool() *pagesPool {
	s.poolOnce.Do(func() {
		n := runtime.GOMAXPROCS(0)
		s.pages = &pagesPool{work: make(chan pagesJob), free: make(chan []byte, 2*n)}
		for range 2 * n {
			s.pages.free <- make([]byte, HashChunkSize)
		}
		for range n {
			s.pages.wg.Add(1)
			go s.pages.worker()
		}
	})
	return s.pages
}

func (pp *pagesPool) worker() {
	defer pp.wg.Done()
	for j := range pp.work {
		_, err := j.p.f.WriteAt(j.data, j.off)
		d := SumPiece(j.data, false) // a signed image's SHA-256s are taken as it is sealed
		pp.free <- j.data[:cap(j.data)]
		j.p.mu.Lock()
		j.p.pieces[j.index] = d
		if err != nil && j.p.err == nil {
			j.p.err = fmt.Errorf("write %s: %w", j.p.rel, err)
		}
		j.p.mu.Unlock()
		j.p.pending.Done()
	}
}

// stopPool ends the workers; the staging's page files must all be closed.
func (s *Staging) stopPool() {
	if s.pages != nil {
		close(s.pages.work)
		s.pages.wg.Wait()
		s.pages = nil
	}
}

// CreatePages starts the page file name (such as "pages-65537.img") in the staged image's
// CRIU directory.
func (s *Staging) CreatePages(name string) (*PagesFile, error) {
	rel := CRIUDir + "/" + name
	f, err := os.OpenFile(filepath.Join(s.dir, filepath.FromSlash(rel)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", rel, err)
	}
	s.pool()
	p := &PagesFile{s: s, rel: rel, f: f}
	s.mu.Lock()
	s.pagesFiles = append(s.pagesFiles, p)
	s.mu.Unlock()
	return p, nil
}

// Receive reads the file's next size bytes from r. vaddr, where the pages start in the
// process, does not matter to a file written in order.
func (p *PagesFile) Receive(_ uint64, size int, r io.Reader) error {
	for size > 0 {
		if p.buf == nil {
			p.buf = (<-p.s.pages.free)[:0]
		}
		n := min(size, HashChunkSize-len(p.buf))
		at := len(p.buf)
		p.buf = p.buf[:at+n]
		if _, err := io.ReadFull(r, p.buf[at:]); err != nil {
			return fmt.Errorf("receive %s: %w", p.rel, err)
		}
		size -= n
		if len(p.buf) == HashChunkSize {
			p.emit()
		}
	}
	return p.firstErr()
}

func (p *PagesFile) emit() {
	p.mu.Lock()
	index := len(p.pieces)
	p.pieces = append(p.pieces, Piece{})
	p.mu.Unlock()
	p.pending.Add(1)
	p.s.pages.work <- pagesJob{p: p, index: index, off: p.off, data: p.buf}
	p.off += int64(len(p.buf))
	p.buf = nil
}

func (p *PagesFile) firstErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close writes what is left, waits for the workers and makes the file durable.
func (p *PagesFile) Close() error {
	if p.closed {
		return p.firstErr()
	}
	p.closed = true
	if len(p.buf) > 0 {
		p.emit()
	} else if p.buf != nil {
		p.s.pages.free <- p.buf[:cap(p.buf)]
		p.buf = nil
	}
	p.pending.Wait()
	err := p.firstErr()
	if err == nil {
		if err = p.f.Sync(); err != nil {
			err = fmt.Errorf("sync %s: %w", p.rel, err)
		}
	}
	if cerr := p.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close %s: %w", p.rel, cerr)
	}
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	return err
}

// entry is the file's manifest entry; the file must be closed.
func (p *PagesFile) entry() File {
	return FileOf(p.rel, p.off, p.pieces, false)
}

// writtenFiles ends the page files' workers and returns their manifest entries, or the
// first error any of them met.
func (s *Staging) writtenFiles() ([]File, error) {
	s.mu.Lock()
	files := s.pagesFiles
	s.mu.Unlock()
	var out []File
	for _, p := range files {
		if !p.closed {
			return nil, fmt.Errorf("%s is still being written", p.rel)
		}
		if err := p.firstErr(); err != nil {
			return nil, err
		}
		out = append(out, p.entry())
	}
	s.stopPool()
	return out, nil
}
