package proctree

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// The tables' own form: IPv4 words and IPv6's four words each in the host's order, an IPv4
// address mapped into IPv6 given as IPv4, a header and short lines passed over.
func TestParseTCPTable(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:B7D3 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 20 4 30 10 -1
   1: 00000000000000000000000001000000:0050 0000000000000000FFFF00000100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 77 1
   2: short line
`)
	got := ParseTCPTable(table)
	if len(got) != 2 {
		t.Fatalf("entries %+v, want 2", got)
	}
	if e := got[0]; e.Local.String() != "127.0.0.1:47059" || e.Remote.String() != "127.0.0.1:8080" || e.State != TCPEstablished || e.UID != "0" || e.Inode != "4242" {
		t.Errorf("IPv4 entry %+v", e)
	}
	if e := got[1]; e.Local.String() != "[::1]:80" || e.Remote.String() != "127.0.0.1:50000" || e.UID != "1000" || e.Inode != "77" {
		t.Errorf("IPv6 entry %+v", e)
	}
}

// The real /proc: a connection this test holds is found among its own, from its own
// network namespace's table.
func TestTCPConnectionsOfThisProcess(t *testing.T) {
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
	self, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	conns := Snap("/proc", []Process{self}).TCPConnections(os.Getpid())
	want := c.LocalAddr().String()
	for _, e := range conns {
		if e.Local.String() == want && e.Remote.String() == l.Addr().String() {
			return
		}
	}
	t.Fatalf("connection %s to %s not among %+v (pid %s)", want, l.Addr(), conns, strconv.Itoa(os.Getpid()))
}
