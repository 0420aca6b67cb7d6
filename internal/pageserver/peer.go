package pageserver

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/proctree"
)

// fromOwnTree says whether the connection c comes from gpucr itself or a process it started
// (CRIU, directly or under a container runtime): the page server listens on loopback TCP,
// which any local user can reach, and only gpucr's own CRIU may send it pages. The peer's
// socket is found in /proc/net/tcp by its port and then among the descriptors of gpucr's
// descendants.
func fromOwnTree(c net.Conn) (bool, error) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	peer, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return false, nil
	}
	inode, err := socketInode(peer.Port, local.Port)
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

// socketInode is the inode of the root-owned loopback TCP socket from port from to port to,
// or "" if there is none.
func socketInode(from, to int) (string, error) {
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
		if len(fl) < 10 || fl[7] != "0" {
			continue
		}
		if port(fl[1]) == from && port(fl[2]) == to {
			return fl[9], nil
		}
	}
	return "", sc.Err()
}

// port is the port of a /proc/net/tcp address, "0100007F:1F90".
func port(addr string) int {
	_, hex, _ := strings.Cut(addr, ":")
	p, err := strconv.ParseUint(hex, 16, 16)
	if err != nil {
		return -1
	}
	return int(p)
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
