package container

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
)

// errCRIUDied is a runc call whose CRIU ended without answering runc.
var errCRIUDied = errors.New("runc's CRIU died without an answer (killed?)")

// criuGoneGrace is how long runc may leave its exited CRIU unreaped before unstick takes
// it as waiting for good.
const criuGoneGrace = 2 * time.Second

// unstick kills runc (with kill) once runc's CRIU has stayed a zombie for criuGoneGrace,
// until done, and says whether it did: runc reaps its CRIU as soon as CRIU has answered, so
// one left unreaped means runc still waits for the answer of a CRIU that was killed, and
// the processes CRIU forked, which hold CRIU's socket, keep that wait from ever ending
// (crash test: gpucr waited on runc for good). runc alone goes: what its CRIU made the
// restore kills from its watch, and the rest of what runc started (its hooks) is not the
// restore's; kill, not a PID, so that a runc reaped meanwhile is no other process.
func unstick(runc int, kill func() error, done <-chan struct{}) bool {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var since time.Time
	for {
		select {
		case <-done:
			return false
		case <-t.C:
		}
		switch {
		case !exitedCRIU(runc) || !holdsCRIUSocket(runc):
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= criuGoneGrace:
			_ = kill()
			return true
		}
	}
}

// exitedCRIU says whether runc's CRIU, its oldest child named criu, exited and was not
// reaped. Only the oldest: the restored root is runc's child too (CRIU forks it as runc's)
// and named criu until its restorer renames it, and one that died while CRIU went on
// (killed by the OOM killer mid-restore) would have been taken for CRIU (review).
func exitedCRIU(runc int) bool {
	var first proctree.Process
	for _, c := range proctree.Children(runc) {
		p, err := proctree.Read(c)
		if err == nil && p.Command == "criu" && (first.PID == 0 || p.Start < first.Start || p.Start == first.Start && p.PID < first.PID) {
			first = p
		}
	}
	return first.PID != 0 && first.Zombie
}

// holdsCRIUSocket says whether runc still holds a seqpacket socket: its end of the one to
// its CRIU (the only such socket runc has), which it closes once its exchange with CRIU
// ends, answered or not. A runc that has closed it does not wait on CRIU, though a zombie
// CRIU may still be its child: on CRIU's failure runc runs its poststop hooks and removes
// the container with CRIU, and the restored root CRIU forked (runc's child, named criu),
// unreaped (review: a 4 s poststop hook was killed and CRIU's own error replaced).
func holdsCRIUSocket(runc int) bool {
	files, err := proctree.OpenFiles("/proc", runc)
	if err != nil {
		return false
	}
	held := proctree.SocketInodes(files)
	if len(held) == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", runc))
	if err != nil {
		return true // cannot tell: taken as waiting, as before
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode [Path]; Type 0005 is SOCK_SEQPACKET.
		if f := strings.Fields(line); len(f) >= 7 && f[4] == "0005" && held[f[6]] {
			return true
		}
	}
	return false
}
