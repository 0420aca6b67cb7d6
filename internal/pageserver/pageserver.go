// Package pageserver receives a CRIU dump's memory pages over CRIU's page-server protocol,
// so that they can go straight to their destination instead of into a local image first.
//
// CRIU (criu/page-xfer.c) connects to the page server and sends, for each pagemap it
// dumps, an OPEN, then one ADD per run of pages followed by the pages themselves, and a
// CLOSE at the end of the dump. The server writes the pagemap images (small) into a local
// directory, as CRIU's own page server does, and hands the page bytes to a Sink.
package pageserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/criuimg"
)

// Sink receives the pages of each pages file, in the order CRIU sends them.
type Sink interface {
	// Create starts the pages file with the given name, such as "pages-65537.img".
	Create(name string) (criuimg.Receiver, error)
}

// The protocol's commands and pagemap types (criu/page-xfer.c).
const (
	cmdAdd        = 1
	cmdHole       = 2
	cmdOpen       = 3
	cmdOpen2      = 4
	cmdParent     = 5
	cmdAddF       = 6
	cmdGet        = 7
	cmdClose      = 0x1023
	cmdForceClose = 0x1024

	cmdBits  = 16
	typeBits = 8
	typePID  = 1
	typeShm  = 2
)

// firstPagesID is where the ids of the pages files start: CRIU's own page server starts
// there too (up_page_ids_base), so that they never meet the ids of pagemaps the dumping
// side might write itself.
const firstPagesID = 0x10001

// iov is the header of every message CRIU sends.
type iov struct {
	Cmd     uint32
	NrPages uint32
	Vaddr   uint64
	DstID   uint64
}

// Server is a page server for one CRIU dump on a loopback port.
type Server struct {
	ln   net.Listener
	dir  string
	sink Sink

	done  chan struct{}
	err   error
	pages []string // names of the pages files received, in order
	conn  net.Conn
	mu    sync.Mutex
}

// Start listens on a free loopback port and serves the first connection from gpucr's own
// CRIU: its dump.
// Pagemap images are written into dir, pages go to sink.
func Start(dir string, sink Sink) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("page server: listen on loopback: %w", err)
	}
	s := &Server{ln: ln, dir: dir, sink: sink, done: make(chan struct{})}
	go s.acceptOne()
	return s, nil
}

// Port is the loopback port CRIU must connect to.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Wait returns once CRIU flushed its pages and disconnected, with the names of the pages
// files received; or with the error that ended the transfer.
func (s *Server) Wait(ctx context.Context) ([]string, error) {
	select {
	case <-s.done:
		return s.pages, s.err
	case <-ctx.Done():
		s.Close()
		return nil, context.Cause(ctx)
	}
}

// Err is the error that ended the transfer, once it has ended; nil while it runs or when it
// ended well. A dump that failed because the page server hung up has its reason here.
func (s *Server) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Close stops the server and returns once it no longer touches its sink; a transfer in
// progress fails. It is safe to call more than once.
func (s *Server) Close() {
	s.ln.Close()
	s.mu.Lock()
	if s.conn != nil {
		s.conn.Close()
	}
	s.mu.Unlock()
	<-s.done
}

func (s *Server) acceptOne() {
	c, err := s.accept()
	s.ln.Close() // one dump, one connection
	if err != nil {
		s.err = fmt.Errorf("page server: CRIU never connected: %w", err)
		close(s.done)
		return
	}
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	s.err = s.serve(c)
	// Done before the hang-up: once CRIU has seen the connection end, Err has the reason.
	close(s.done)
	c.Close()
}

// accept returns the first connection that comes from gpucr's own CRIU; others (another
// local user's, say, to block or feed the dump) are closed unread. Each is checked on its
// own, beside the others: checked in turn, a flood of them kept CRIU's waiting (a dump took
// 33 s instead of 2.5, a hostile test).
func (s *Server) accept() (net.Conn, error) {
	found := make(chan net.Conn)
	failed := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				select {
				case failed <- err:
				default:
				}
				return
			}
			go func() {
				ok, err := fromOwnTree(c)
				if ok {
					select {
					case found <- c:
						return
					case <-stop:
					}
				}
				c.Close()
				if err != nil {
					select {
					case failed <- err:
					default:
					}
				}
			}()
		}
	}()
	select {
	case c := <-found:
		return c, nil
	case err := <-failed:
		return nil, err
	}
}

// serve runs the protocol on one connection until CRIU's CLOSE and hang-up.
func (s *Server) serve(c net.Conn) error {
	r := bufio.NewReaderSize(c, 1<<20)
	var cur *pagemapFile
	defer func() {
		if cur != nil {
			cur.abort()
		}
	}()
	nextID := uint32(firstPagesID)
	open := func(dstID uint64) error {
		if cur != nil {
			if err := cur.close(); err != nil {
				return err
			}
			cur = nil
		}
		f, err := s.open(dstID, nextID)
		if err != nil {
			return err
		}
		nextID++
		cur = f
		return nil
	}
	for {
		var m iov
		if err := binary.Read(r, binary.NativeEndian, &m); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return errors.New("page server: CRIU disconnected before it flushed its pages")
			}
			return fmt.Errorf("page server: read from CRIU: %w", err)
		}
		cmd, flags := m.Cmd&(1<<cmdBits-1), m.Cmd>>cmdBits
		switch cmd {
		case cmdOpen, cmdOpen2:
			if err := open(m.DstID); err != nil {
				return err
			}
			if cmd == cmdOpen2 {
				// The answer says whether a parent image exists: never, here.
				if _, err := c.Write([]byte{0}); err != nil {
					return fmt.Errorf("page server: answer CRIU: %w", err)
				}
			}
		case cmdParent:
			if err := binary.Write(c, binary.NativeEndian, int32(0)); err != nil {
				return fmt.Errorf("page server: answer CRIU: %w", err)
			}
		case cmdAdd, cmdAddF, cmdHole:
			switch cmd {
			case cmdAdd:
				flags = criuimg.PEPresent
			case cmdHole:
				flags = criuimg.PEParent
			}
			if cur == nil || cur.dstID != m.DstID {
				if err := open(m.DstID); err != nil {
					return err
				}
			}
			if err := cur.add(m, flags, r); err != nil {
				return err
			}
		case cmdClose, cmdForceClose:
			if cur != nil {
				err := cur.close()
				cur = nil
				if err != nil {
					return err
				}
			}
			if err := binary.Write(c, binary.NativeEndian, int32(0)); err != nil {
				return fmt.Errorf("page server: answer CRIU: %w", err)
			}
			if cmd == cmdClose {
				// CRIU hangs up once it has read the answer.
				_, _ = io.Copy(io.Discard, r)
			}
			return nil
		case cmdGet:
			return errors.New("page server: CRIU asked for pages back (lazy pages are not supported)")
		default:
			return fmt.Errorf("page server: unknown command %#x from CRIU", m.Cmd)
		}
	}
}

// pagemapFile is the pagemap image being written and the pages file it describes.
type pagemapFile struct {
	dstID uint64
	path  string
	f     *os.File
	w     *bufio.Writer
	pm    *criuimg.PagemapWriter
	pages criuimg.Receiver
}

// open starts the pagemap image for CRIU's dstID and its pages file pagesID.
func (s *Server) open(dstID uint64, pagesID uint32) (*pagemapFile, error) {
	var name string
	switch id := dstID >> typeBits; dstID & (1<<typeBits - 1) {
	case typePID:
		name = criuimg.PagemapName(int(id))
	case typeShm:
		name = criuimg.ShmemPagemapName(id)
	default:
		return nil, fmt.Errorf("page server: unknown pagemap type in %#x (CRIU older than 3.3?)", dstID)
	}
	path := filepath.Join(s.dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("page server: %w", err)
	}
	p := &pagemapFile{dstID: dstID, path: path, f: f, w: bufio.NewWriter(f)}
	if p.pm, err = criuimg.NewPagemapWriter(p.w, &pagemap.PagemapHead{PagesId: proto.Uint32(pagesID)}); err != nil {
		p.abort()
		return nil, fmt.Errorf("page server: %w", err)
	}
	pagesName := criuimg.PagesName(pagesID)
	pages, err := s.sink.Create(pagesName)
	if err != nil { // pages may be a typed nil: it is no file to close
		p.abort()
		return nil, fmt.Errorf("page server: start %s: %w", pagesName, err)
	}
	p.pages = pages
	s.pages = append(s.pages, pagesName)
	return p, nil
}

// add records one run of pages and, if they are present, receives them.
func (p *pagemapFile) add(m iov, flags uint32, r io.Reader) error {
	e := &pagemap.PagemapEntry{Vaddr: proto.Uint64(m.Vaddr), NrPages: proto.Uint32(m.NrPages), Flags: proto.Uint32(flags)}
	if err := p.pm.Add(e); err != nil {
		return fmt.Errorf("page server: %w", err)
	}
	if flags&criuimg.PEPresent == 0 {
		return nil
	}
	if err := p.pages.Receive(m.Vaddr, int(m.NrPages)*criuimg.PageSize, r); err != nil {
		return fmt.Errorf("page server: pages at %#x: %w", m.Vaddr, err)
	}
	return nil
}

// close finishes the pagemap image (durably) and the pages file.
func (p *pagemapFile) close() error {
	err := p.w.Flush()
	if err == nil {
		err = p.f.Sync()
	}
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if perr := p.pages.Close(); err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("page server: finish %s: %w", filepath.Base(p.path), err)
	}
	return nil
}

func (p *pagemapFile) abort() {
	p.f.Close()
	if p.pages != nil {
		p.pages.Close()
	}
}
