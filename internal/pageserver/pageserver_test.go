package pageserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"

	"github.com/gpucr/gpucr/internal/criuimg"
)

// memSink keeps what it receives, per file, as (vaddr, bytes) runs.
type memSink struct{ files map[string]*memFile }

type memFile struct {
	data   bytes.Buffer
	vaddrs []uint64
	closed bool
}

func (s *memSink) Create(name string) (criuimg.Receiver, error) {
	f := &memFile{}
	s.files[name] = f
	return f, nil
}

func (f *memFile) Receive(vaddr uint64, size int, r io.Reader) error {
	f.vaddrs = append(f.vaddrs, vaddr)
	_, err := io.CopyN(&f.data, r, int64(size))
	return err
}

func (f *memFile) Close() error { f.closed = true; return nil }

// client plays CRIU's side of the protocol (criu/page-xfer.c).
type client struct {
	t *testing.T
	c net.Conn
}

func (c *client) send(cmd, nr uint32, vaddr, dst uint64, pages []byte) {
	c.t.Helper()
	if err := binary.Write(c.c, binary.NativeEndian, iov{cmd, nr, vaddr, dst}); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.c.Write(pages); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) answer(n int) []byte {
	c.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(c.c, b); err != nil {
		c.t.Fatal(err)
	}
	return b
}

// connect starts a server and connects to it as CRIU would.
func connect(t *testing.T, dir string, sink Sink) (*Server, *client) {
	t.Helper()
	s, err := Start(dir, sink)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(s.Port()))
	if err != nil {
		t.Fatal(err)
	}
	return s, &client{t, conn}
}

func pages(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n*criuimg.PageSize) }

// Two processes' pagemaps and one shared-memory pagemap arrive as CRIU sends them: the
// pagemap images are written as CRIU's own page server writes them and decode with crit,
// and the present pages reach the sink in order, the others are only recorded.
func TestServerSpeaksCRIUsProtocol(t *testing.T) {
	dir := t.TempDir()
	sink := &memSink{files: map[string]*memFile{}}
	s, c := connect(t, dir, sink)
	conn := c.c
	pid := func(id uint64) uint64 { return id<<typeBits | typePID }
	shm := func(id uint64) uint64 { return id<<typeBits | typeShm }

	c.send(cmdParent, 0, 0, pid(100), nil)
	if got := c.answer(4); !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Fatalf("parent answer %v", got)
	}
	c.send(cmdOpen2, 0, 0, pid(100), nil)
	if got := c.answer(1); got[0] != 0 {
		t.Fatalf("open answer %v", got)
	}
	c.send(cmdAddF|criuimg.PEPresent<<cmdBits, 2, 0x400000, pid(100), pages(2, 1))
	c.send(cmdAddF|criuimg.PELazy<<cmdBits, 3, 0x500000, pid(100), nil) // recorded, no data
	c.send(cmdAddF|criuimg.PEPresent<<cmdBits, 1, 0x7f0000, pid(100), pages(1, 2))
	c.send(cmdOpen2, 0, 0, pid(101), nil)
	c.answer(1)
	c.send(cmdAdd, 1, 0x1000, pid(101), pages(1, 3)) // the old command: present
	c.send(cmdOpen2, 0, 0, shm(7), nil)
	c.answer(1)
	c.send(cmdAddF|criuimg.PEPresent<<cmdBits, 1, 0, shm(7), pages(1, 4))
	c.send(cmdClose, 0, 0, 0, nil)
	if got := c.answer(4); !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Fatalf("close answer %v", got)
	}
	conn.Close()
	names, err := s.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, " ") != "pages-65537.img pages-65538.img pages-65539.img" {
		t.Fatalf("pages files %v", names)
	}

	first := sink.files["pages-65537.img"]
	if !first.closed || !bytes.Equal(first.data.Bytes(), append(pages(2, 1), pages(1, 2)...)) || len(first.vaddrs) != 2 || first.vaddrs[1] != 0x7f0000 {
		t.Errorf("first pages file: closed %v, %d bytes, vaddrs %x", first.closed, first.data.Len(), first.vaddrs)
	}
	if f := sink.files["pages-65539.img"]; !bytes.Equal(f.data.Bytes(), pages(1, 4)) {
		t.Errorf("shared memory pages: %d bytes", f.data.Len())
	}

	head, entries := readPagemap(t, filepath.Join(dir, "pagemap-100.img"))
	if head != 65537 || len(entries) != 3 || entries[1].GetVaddr() != 0x500000 || entries[1].GetNrPages() != 3 ||
		entries[1].GetFlags() != criuimg.PELazy || entries[2].GetFlags() != criuimg.PEPresent {
		t.Errorf("pagemap-100: head %d, entries %v", head, entries)
	}
	if head, entries := readPagemap(t, filepath.Join(dir, "pagemap-101.img")); head != 65538 || len(entries) != 1 || entries[0].GetFlags() != criuimg.PEPresent {
		t.Errorf("pagemap-101: head %d, entries %v", head, entries)
	}
	if head, _ := readPagemap(t, filepath.Join(dir, "pagemap-shmem-7.img")); head != 65539 {
		t.Errorf("pagemap-shmem-7: head %d", head)
	}
}

func readPagemap(t *testing.T, path string) (uint32, []*pagemap.PagemapEntry) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, true).Decode(&pagemap.PagemapEntry{})
	if err != nil {
		t.Fatalf("crit decode %s: %v", path, err)
	}
	var head uint32
	var entries []*pagemap.PagemapEntry
	for _, e := range img.Entries {
		switch m := e.Message.(type) {
		case *pagemap.PagemapHead:
			head = m.GetPagesId()
		case *pagemap.PagemapEntry:
			entries = append(entries, m)
		}
	}
	return head, entries
}

// A dump that hangs up before CLOSE is an error, never a complete set of pages.
func TestServerRefusesUnflushedHangUp(t *testing.T) {
	s, c := connect(t, t.TempDir(), &memSink{files: map[string]*memFile{}})
	conn := c.c
	c.send(cmdOpen2, 0, 0, 5<<typeBits|typePID, nil)
	c.answer(1)
	c.send(cmdAddF|criuimg.PEPresent<<cmdBits, 2, 0x1000, 5<<typeBits|typePID, pages(1, 9)) // one page short
	conn.Close()
	if _, err := s.Wait(context.Background()); err == nil || !strings.Contains(err.Error(), "pages at 0x1000") {
		t.Fatalf("Wait = %v, want the short run named", err)
	}
}

// Another local process that connects first (a user's loop, racing every dump) neither
// blocks the dump nor feeds it: its connection is closed unread, and gpucr's own CRIU (here,
// this process) is served.
func TestServerServesOnlyItsOwnCRIU(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to play the other process")
	}
	s, err := Start(t.TempDir(), &memSink{files: map[string]*memFile{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// An orphan, not a descendant of this process: the outer shell exits at once.
	ready := filepath.Join(t.TempDir(), "connected")
	script := fmt.Sprintf(`exec 3<>/dev/tcp/127.0.0.1/%d && touch %s && sleep 5`, s.Port(), ready)
	if out, err := exec.Command("sh", "-c", `"$0" -c "$1" >/dev/null 2>&1 &`, bash, script).CombinedOutput(); err != nil {
		t.Fatalf("start the other process: %v %s", err, out)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other process never connected")
		}
	}
	ownDumpIsServed(t, s)
}

// ownDumpIsServed connects to s from this process, as gpucr's own CRIU, ends the dump, and
// fails unless s served it.
func ownDumpIsServed(t *testing.T, s *Server) {
	t.Helper()
	conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(s.Port()))
	if err != nil {
		t.Fatalf("the dump's own connection: %v", err)
	}
	c := &client{t, conn}
	c.send(cmdClose, 0, 0, 0, nil)
	if got := c.answer(4); !bytes.Equal(got, []byte{0, 0, 0, 0}) {
		t.Fatalf("close answer %v", got)
	}
	conn.Close()
	if _, err := s.Wait(context.Background()); err != nil {
		t.Fatalf("the dump's own connection: %v", err)
	}
}

// failingSink refuses every file the way a failed store does: a typed nil and an error.
type failingSink struct{}

func (failingSink) Create(string) (criuimg.Receiver, error) {
	var f *memFile // what a sink's own Create returns on failure
	return f, errors.New("store gone")
}

// A sink that cannot start a pages file fails the dump with its reason: the half-opened
// pagemap is cleaned up without touching the file that never was.
func TestServerReportsSinkThatCannotCreate(t *testing.T) {
	s, c := connect(t, t.TempDir(), failingSink{})
	defer c.c.Close()
	c.send(cmdOpen2, 0, 0, 5<<typeBits|typePID, nil)
	if _, err := s.Wait(context.Background()); err == nil || !strings.Contains(err.Error(), "store gone") {
		t.Fatalf("Wait = %v, want the sink's error", err)
	}
}

// TestMain lets this test binary play another local user's process: run with
// GPUCR_TEST_DIAL=ADDR it connects to ADDR from 127.0.0.2 and the same port, as an orphan
// outside this process's tree (dialFromItsPort).
func TestMain(m *testing.M) {
	if to := os.Getenv("GPUCR_TEST_DIAL"); to != "" {
		dialFromItsPort(to)
		return
	}
	os.Exit(m.Run())
}

// dialFromItsPort starts itself again as user nobody in a session of its own and exits, so
// that the copy is another user's and nobody's descendant; the copy connects to to from
// 127.0.0.2 and to's own port, writes GPUCR_TEST_READY once connected, and holds the
// connection a few seconds.
func dialFromItsPort(to string) {
	if os.Getenv("GPUCR_TEST_ORPHAN") == "" {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "GPUCR_TEST_ORPHAN=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		_ = cmd.Start()
		return
	}
	addr, err := net.ResolveTCPAddr("tcp", to)
	if err != nil {
		return
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: addr.Port}}
	c, err := d.Dial("tcp", to)
	if err != nil {
		return
	}
	_ = os.WriteFile(os.Getenv("GPUCR_TEST_READY"), nil, 0o600)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Read(make([]byte, 1))
	c.Close()
}

// A process of another user that connects from another loopback address and the server's
// own port is not taken for gpucr's CRIU: its socket's ports alone matched gpucr's own side
// of the connection, the server took it and closed its listener, and the user could listen
// on the port for CRIU to reach — reading and rewriting every page of the dump (a hostile
// test). The dump's own connection is served.
func TestServerIsNotFooledByItsOwnPort(t *testing.T) {
	s, err := Start(t.TempDir(), &memSink{files: map[string]*memFile{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to play another user")
	}
	// A copy of this binary that user nobody can run, in a directory it can write.
	dir, err := os.MkdirTemp("", "gpucr-dial-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	b, err := os.ReadFile(os.Args[0])
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "dial"), b, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o777)
	}
	if err != nil {
		t.Fatal(err)
	}
	ready := filepath.Join(dir, "connected")
	cmd := exec.Command(filepath.Join(dir, "dial"))
	cmd.Env = append(os.Environ(), "GPUCR_TEST_DIAL=127.0.0.1:"+strconv.Itoa(s.Port()), "GPUCR_TEST_READY="+ready)
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Skip("could not connect from 127.0.0.2 with the server's port")
		}
	}
	time.Sleep(200 * time.Millisecond) // the server has looked at it
	ownDumpIsServed(t, s)
}
