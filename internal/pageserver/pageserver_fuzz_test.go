package pageserver

import (
	"bytes"
	"encoding/binary"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/fuzzcheck"
)

// streamConn is CRIU's end of a connection as a byte stream: serve reads the stream and
// its answers are kept.
type streamConn struct {
	net.Conn // nil: only Read, Write and Close are used
	r        *bytes.Reader
	answers  bytes.Buffer
}

func (c *streamConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c *streamConn) Write(b []byte) (int, error) { return c.answers.Write(b) }
func (c *streamConn) Close() error                { return nil }

// msg is one message as CRIU sends it: the header, then the pages, if any.
func msg(cmd, nr uint32, vaddr, dst uint64, pages []byte) []byte {
	b, err := binary.Append(nil, binary.NativeEndian, iov{cmd, nr, vaddr, dst})
	if err != nil {
		panic(err)
	}
	return append(b, pages...)
}

// The page server reads whatever connects to it from gpucr's tree: a CRIU of another
// version, or one gone wrong. Whatever the stream, serve returns, having closed every pages
// file it started; it allocates in proportion to the stream, not to the page counts it
// names; and when it accepts the stream, each pagemap it wrote decodes and accounts for its
// pages file exactly, in CRIU's order.
func FuzzServe(f *testing.F) {
	pid := func(id uint64) uint64 { return id<<typeBits | typePID }
	shm := func(id uint64) uint64 { return id<<typeBits | typeShm }
	page := func(fill byte) []byte { return bytes.Repeat([]byte{fill}, criuimg.PageSize) }
	closing := msg(cmdClose, 0, 0, 0, nil)
	full := slices.Concat(
		msg(cmdParent, 0, 0, pid(100), nil),
		msg(cmdOpen2, 0, 0, pid(100), nil),
		msg(cmdAddF|criuimg.PEPresent<<cmdBits, 2, 0x400000, pid(100), append(page(1), page(2)...)),
		msg(cmdAddF|criuimg.PELazy<<cmdBits, 3, 0x500000, pid(100), nil),
		msg(cmdHole, 4, 0x600000, pid(100), nil),
		msg(cmdOpen2, 0, 0, pid(101), nil),
		msg(cmdAdd, 1, 0x1000, pid(101), page(3)),
		msg(cmdOpen, 0, 0, shm(7), nil),
		msg(cmdAddF|criuimg.PEPresent<<cmdBits, 1, 0, shm(7), page(4)),
		closing)
	if err := (&Server{dir: f.TempDir(), sink: &memSink{files: map[string]*memFile{}}}).serve(&streamConn{r: bytes.NewReader(full)}); err != nil {
		f.Fatalf("the sample stream: %v", err)
	}
	f.Add(full)
	f.Add(closing)
	f.Add(msg(cmdForceClose, 0, 0, 0, nil))
	f.Add(slices.Concat(msg(cmdAdd, 0, 0x1000, pid(5), nil), closing))                       // ADD without OPEN, no pages
	f.Add(slices.Concat(msg(cmdOpen2, 0, 0, pid(5), nil), msg(cmdOpen2, 0, 0, pid(5), nil))) // the same pagemap twice
	f.Add(slices.Concat(msg(cmdOpen2, 0, 0, 5<<typeBits|3, nil), closing))                   // unknown pagemap type
	f.Add(slices.Concat(msg(cmdOpen2, 0, 0, pid(5), nil), msg(cmdAdd, 0xffffffff, 0x1000, pid(5), page(9))))
	f.Add(msg(cmdGet, 1, 0x1000, pid(5), nil))
	f.Add(msg(0xdead, 0, 0, 0, nil))
	f.Add(full[:len(full)-len(closing)]) // hung up before CLOSE
	f.Add(full[:30])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, stream []byte) {
		dir := t.TempDir()
		sink := &memSink{files: map[string]*memFile{}}
		s := &Server{dir: dir, sink: sink}
		c := &streamConn{r: bytes.NewReader(stream)}
		var err error
		if n := fuzzcheck.Allocated(func() { err = s.serve(c) }); n > fuzzcheck.AllocSlack+uint64(16*len(stream)) {
			t.Fatalf("serve allocated %d bytes for a %d-byte stream", n, len(stream))
		}
		if len(s.pages) != len(sink.files) {
			t.Fatalf("server lists pages files %v, the sink got %d", s.pages, len(sink.files))
		}
		for i, name := range s.pages {
			if want := criuimg.PagesName(uint32(firstPagesID + i)); name != want {
				t.Fatalf("pages file %d is %s, want %s", i, name, want)
			}
			if !sink.files[name].closed {
				t.Fatalf("serve returned (%v) and left %s open", err, name)
			}
		}
		if err != nil {
			return
		}
		maps, _ := filepath.Glob(filepath.Join(dir, criuimg.PagemapGlob))
		if len(maps) != len(s.pages) {
			t.Fatalf("%d pagemaps written for %d pages files", len(maps), len(s.pages))
		}
		for _, path := range maps {
			head, entries := readPagemap(t, path)
			file := sink.files[criuimg.PagesName(head)]
			if file == nil {
				t.Fatalf("%s names pages-%d.img, which the sink never got", filepath.Base(path), head)
			}
			var want int
			var vaddrs []uint64
			for _, e := range entries {
				if e.GetFlags()&criuimg.PEPresent != 0 {
					want += int(e.GetNrPages()) * criuimg.PageSize
					vaddrs = append(vaddrs, e.GetVaddr())
				}
			}
			if file.data.Len() != want || !slices.Equal(file.vaddrs, vaddrs) {
				t.Fatalf("%s lists %d bytes at %x; its pages file got %d at %x",
					filepath.Base(path), want, vaddrs, file.data.Len(), file.vaddrs)
			}
		}
	})
}
