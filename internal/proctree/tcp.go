package proctree

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TCPEntry is one socket of a /proc/net/tcp{,6} table.
type TCPEntry struct {
	Local, Remote netip.AddrPort
	State         string // hex, as the table writes it: TCPEstablished
	UID, Inode    string
	// RxQueue is the table's rx_queue: bytes received and not read on a connection; on a
	// listening socket, the connections the kernel has completed and the process has not
	// accepted (its accept backlog, as CRIU's socket diagnostics report it too).
	RxQueue uint64
}

const (
	// TCPEstablished is the state /proc/net/tcp gives an established connection.
	TCPEstablished = "01"
	// TCPListen is the state /proc/net/tcp gives a listening socket.
	TCPListen = "0A"
)

// tcpConnected names the states /proc/net/tcp gives a socket with a peer: established,
// connecting, or closing with a descriptor still on it. CRIU dumps a socket in any of them
// only with --tcp-established; one whose peer had closed (CLOSE_WAIT, a client's idle
// keep-alive connection a server dropped) passed as no connection, and the dump failed
// "Connected TCP socket, consider using --tcp-established" (review). A listening or
// unconnected socket (TCP_CLOSE) it dumps as it is; TIME_WAIT and SYN_RECV are the
// kernel's alone, on no descriptor.
var tcpConnected = map[string]string{
	TCPEstablished: "ESTABLISHED",
	"02":           "SYN_SENT",
	"04":           "FIN_WAIT1",
	"05":           "FIN_WAIT2",
	"08":           "CLOSE_WAIT",
	"09":           "LAST_ACK",
	"0B":           "CLOSING",
}

// StateName is e's state as the kernel names it where it is a connection's
// (tcpConnected), else its number in hex.
func (e TCPEntry) StateName() string {
	if n, ok := tcpConnected[e.State]; ok {
		return n
	}
	return e.State
}

// ParseTCPTable reads a /proc/net/tcp or tcp6 table; lines it cannot read are left out.
func ParseTCPTable(table []byte) []TCPEntry {
	var out []TCPEntry
	sc := bufio.NewScanner(bytes.NewReader(table))
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		local, ok1 := parseProcAddr(f[1])
		remote, ok2 := parseProcAddr(f[2])
		if ok1 && ok2 {
			e := TCPEntry{Local: local, Remote: remote, State: f[3], UID: f[7], Inode: f[9]}
			if _, rx, ok := strings.Cut(f[4], ":"); ok {
				e.RxQueue, _ = strconv.ParseUint(rx, 16, 64)
			}
			out = append(out, e)
		}
	}
	return out
}

// parseProcAddr reads an address and port as /proc/net/tcp{,6} writes them: the address in
// hex, each 32-bit word in the host's order (little-endian on the machines gpucr runs on),
// then the port in hex. An IPv4 address mapped into IPv6 is given as IPv4.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	addr, port, ok := strings.Cut(s, ":")
	p, err := strconv.ParseUint(port, 16, 16)
	if !ok || err != nil {
		return netip.AddrPort{}, false
	}
	b, err := hex.DecodeString(addr)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, false
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	ip, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip.Unmap(), uint16(p)), true
}

// TCPConnections lists the TCP connections pid holds a descriptor on, established or in
// another state with a peer (tcpConnected), from the tables of its own network namespace
// (/proc/PID/net/tcp and tcp6). A process that is gone or unreadable holds none.
func (s *Snapshot) TCPConnections(pid int) []TCPEntry {
	return s.tcpSockets(pid, func(e TCPEntry) bool {
		_, ok := tcpConnected[e.State]
		return ok
	})
}

// TCPPendingListeners lists the listening TCP sockets pid holds a descriptor on that have
// connections the kernel has completed and pid has not accepted yet (RxQueue above 0), from
// the tables of its own network namespace. CRIU refuses to dump such a socket, with
// --tcp-established or without ("In-flight connection (l)"); one with none it dumps as it
// is. The connections themselves are on no descriptor (inode 0) until accepted.
func (s *Snapshot) TCPPendingListeners(pid int) []TCPEntry {
	return s.tcpSockets(pid, func(e TCPEntry) bool { return e.State == TCPListen && e.RxQueue > 0 })
}

// tcpSockets lists the sockets of pid's network namespace's tcp and tcp6 tables that pid
// holds a descriptor on and keep accepts. A process that is gone or unreadable holds none.
func (s *Snapshot) tcpSockets(pid int, keep func(TCPEntry) bool) []TCPEntry {
	files, _ := s.Files(pid)
	inodes := SocketInodes(files)
	if len(inodes) == 0 {
		return nil
	}
	var out []TCPEntry
	for _, table := range []string{"tcp", "tcp6"} {
		b, _ := os.ReadFile(filepath.Join(s.root, strconv.Itoa(pid), "net", table))
		for _, e := range ParseTCPTable(b) {
			if inodes[e.Inode] && keep(e) {
				out = append(out, e)
			}
		}
	}
	return out
}

// SocketInodes are the inodes of the sockets among files, the targets of a process's
// descriptors (OpenFiles: "socket:[INODE]"), as /proc/PID/net's tables name them.
func SocketInodes(files []string) map[string]bool {
	inodes := map[string]bool{}
	for _, f := range files {
		if ino, ok := strings.CutPrefix(f, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	return inodes
}
