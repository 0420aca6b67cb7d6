package proctree

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

// The tables' own form: IPv4 words and IPv6's four words each in the host's order, an IPv4
// address mapped into IPv6 given as IPv4, a header and short lines passed over.
func TestParseTCPTable(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:B7D3 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1
   1: 00000000000000000000000001000000:0050 0000000000000000FFFF00000100007F:C350 01 00000010:0000001A 00:00000000 00000000  1000        0 77 1
   2: short line
`)
	got := ParseTCPTable(table)
	if len(got) != 2 {
		t.Fatalf("entries %+v, want 2", got)
	}
	if e := got[0]; e.Local.String() != "127.0.0.1:47059" || e.Remote.String() != "127.0.0.1:8080" || e.State != TCPEstablished || e.UID != "0" || e.Inode != "4242" {
		t.Errorf("IPv4 entry %+v", e)
	}
	if e := got[1]; e.Local.String() != "[::1]:80" || e.Remote.String() != "127.0.0.1:50000" || e.UID != "1000" || e.Inode != "77" || e.RxQueue != 26 {
		t.Errorf("IPv6 entry %+v", e)
	}
}

// The real /proc: a connection this test holds is found among its own, from its own
// network namespace's table.
func TestTCPConnectionsOfThisProcess(t *testing.T) {
	l, self := listenLoopback(t)
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conns := Snap("/proc", []Process{self}).TCPConnections(os.Getpid())
	want := c.LocalAddr().String()
	for _, e := range conns {
		if e.Local.String() == want && e.Remote.String() == l.Addr().String() {
			return
		}
	}
	t.Fatalf("connection %s to %s not among %+v (pid %s)", want, l.Addr(), conns, strconv.Itoa(os.Getpid()))
}

// A connection whose peer has closed its end (CLOSE_WAIT) and one this end has shut down
// for writing (FIN_WAIT2) are connections too: CRIU refuses either without
// --tcp-established, as it does an established one, and the check found neither.
func TestTCPConnectionsClosingAreConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here: " + err.Error())
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// c's end half closed: c goes to FIN_WAIT2 and s, its peer gone, to CLOSE_WAIT.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	self, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Each end by its own address, then its peer's.
	want := map[string]string{
		c.LocalAddr().String() + " " + s.LocalAddr().String(): "FIN_WAIT2",
		s.LocalAddr().String() + " " + c.LocalAddr().String(): "CLOSE_WAIT",
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		found := map[string]string{}
		for _, e := range Snap("/proc", []Process{self}).TCPConnections(os.Getpid()) {
			found[e.Local.String()+" "+e.Remote.String()] = e.StateName()
		}
		missing := ""
		for k, v := range want {
			if found[k] != v {
				missing += fmt.Sprintf(" %s %s (found %q)", k, v, found[k])
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not among the connections:%s", missing)
		}
	}
}

// The real /proc: a listener this test holds, connected to and not accepting, has the
// connection in its backlog; once it accepts, it has none. (CRIU refuses the first.)
func TestTCPPendingListenersOfThisProcess(t *testing.T) {
	l, self := listenLoopback(t)
	pending := func() []TCPEntry { return Snap("/proc", []Process{self}).TCPPendingListeners(os.Getpid()) }
	if p := pending(); len(p) != 0 {
		t.Fatalf("pending listeners %+v before any connection", p)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The handshake is the kernel's: over loopback it is done when Dial returns.
	p := pending()
	if len(p) != 1 || p[0].Local.String() != l.Addr().String() || p[0].RxQueue != 1 || p[0].State != TCPListen {
		t.Fatalf("pending listeners %+v, want %s with 1 connection", p, l.Addr())
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if p := pending(); len(p) != 0 {
		t.Fatalf("pending listeners %+v after the accept", p)
	}
}

// listenLoopback listens on a loopback port for the test's length and reads this process
// as the tree's one process; a host without loopback TCP skips the test.
func listenLoopback(t *testing.T) (net.Listener, Process) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here: " + err.Error())
	}
	t.Cleanup(func() { l.Close() })
	self, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return l, self
}
