package pageserver

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/gpucr/gpucr/internal/proctree"
)

// fromOwnTree says whether the connection c comes from gpucr itself or a process it started
// (CRIU, directly or under a container runtime): the page server listens on loopback TCP,
// which any local user can reach, and only gpucr's own CRIU may send it pages. The peer's
// socket is found in /proc/net/tcp by the whole connection — its own address and port, the
// server's, established — and then among the descriptors of gpucr's descendants. Ports alone
// are not enough: a user who connected from 127.0.0.2 with the server's own port matched
// gpucr's side of that connection, passed, and took the port over for CRIU to reach.
func fromOwnTree(c net.Conn) (bool, error) {
	server, ok1 := c.LocalAddr().(*net.TCPAddr)
	peer, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return false, nil
	}
	inode, err := socketInode(peer, server)
	if err != nil || inode == "" {
		return false, err
	}
	tree, err := proctree.Tree(os.Getpid())
	if err != nil {
		return false, err
	}
	want := "socket:[" + inode + "]"
	return slices.ContainsFunc(tree, func(p proctree.Process) bool { return holds(p.PID, want) }), nil
}

// tcpEstablished is the state /proc/net/tcp gives an established connection.
const tcpEstablished = "01"

// socketInode is the inode of the root-owned, established IPv4 TCP socket whose own end is
// from and whose other end is to, or "" if there is none.
func socketInode(from, to *net.TCPAddr) (string, error) {
	local, remote := procAddr(from), procAddr(to)
	if local == "" || remote == "" {
		return "", nil
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", fmt.Errorf("page server: read the connection's owner: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local rem st queues timer retrnsmt uid timeout inode
		fl := strings.Fields(sc.Text())
		if len(fl) >= 10 && fl[1] == local && fl[2] == remote && fl[3] == tcpEstablished && fl[7] == "0" {
			return fl[9], nil
		}
	}
	return "", sc.Err()
}

// procAddr is an IPv4 address and port as /proc/net/tcp writes them: the address's four
// bytes read as one number in the host's byte order, then the port, in hex ("0100007F:1F90"
// on x86); "" for an address that is not IPv4.
func procAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	if ip == nil {
		return ""
	}
	return fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(ip), a.Port)
}

// holds says whether process pid has a descriptor on link, "socket:[INODE]".
func holds(pid int, link string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == link {
			return true
		}
	}
	return false
}
