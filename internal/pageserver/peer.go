package pageserver

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

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

// socketInode is the inode of the root-owned, established IPv4 TCP socket whose own end is
// from and whose other end is to, or "" if there is none.
func socketInode(from, to *net.TCPAddr) (string, error) {
	if from.IP.To4() == nil || to.IP.To4() == nil {
		return "", nil
	}
	local, remote := from.AddrPort(), to.AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return "", fmt.Errorf("page server: read the connection's owner: %w", err)
	}
	for _, e := range proctree.ParseTCPTable(b) {
		if e.Local == local && e.Remote == remote && e.State == proctree.TCPEstablished && e.UID == "0" {
			return e.Inode, nil
		}
	}
	return "", nil
}

// holds says whether process pid has a descriptor on link, "socket:[INODE]".
func holds(pid int, link string) bool {
	files, err := proctree.OpenFiles("/proc", pid)
	return err == nil && slices.Contains(files, link)
}
