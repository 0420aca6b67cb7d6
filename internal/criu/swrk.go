package criu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/interrupt"
)

// swrkFD is the descriptor CRIU's end of the socket has in CRIU: the first of ExtraFiles.
const swrkFD = 3

// maxResp bounds one message from CRIU; its answers to dump and restore are a few bytes.
const maxResp = 64 << 10

// swrk is one `criu swrk` process and the socket gpucr speaks CRIU's RPC over. gpucr
// starts it itself, rather than through go-criu, to give CRIU an environment of its own
// and to know its PID.
type swrk struct {
	cmd *exec.Cmd
	sk  *os.File
}

// startSwrk starts the CRIU at path in service mode with env added to gpucr's
// environment, shielded from the terminal's Ctrl-C. With ownGroup (a dump) CRIU runs in a
// process group of its own: a signal for gpucr's group (timeout -s KILL, kill -9 -PGID, a
// service manager stopping gpucr, the terminal's Ctrl-\ or Ctrl-Z) must not reach a CRIU that
// holds the tree, whose tasks it may be running injected code in: killed there, CRIU leaves
// a task that dies of SIGTRAP once released. A CRIU that outlives gpucr aborts the dump at
// its next word with gpucr and resumes the tree itself.
func startSwrk(path string, env []string, ownGroup, terminal bool) (*swrk, error) {
	// SEQPACKET keeps CRIU's message boundaries: one read is one message.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	sk := os.NewFile(uintptr(fds[0]), "criu-rpc")
	theirs := os.NewFile(uintptr(fds[1]), "criu-rpc-swrk")
	defer theirs.Close() // CRIU holds its own copy; ours would keep a dead CRIU's socket open
	cmdEnv, err := Environ()
	if err != nil {
		sk.Close()
		return nil, err
	}
	cmdEnv = append(cmdEnv, env...)
	cmd := exec.Command(path, "swrk", fmt.Sprint(swrkFD))
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Env = cmdEnv
	if terminal {
		// A shell job's restore hands the job gpucr's terminal, which CRIU finds on its
		// stdin: given /dev/null, every restore of a job that had a terminal failed
		// ("Don't have tty to inherit session from", hostile test).
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	}
	if ownGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := interrupt.StartImmune(cmd.Start); err != nil {
		sk.Close()
		return nil, err
	}
	return &swrk{cmd: cmd, sk: sk}, nil
}

// call sends req and answers CRIU's notifications through n until CRIU sends its
// response. A notification that n fails ends the exchange: CRIU, finding the socket closed
// by close, aborts the operation (and resumes a tree it was dumping).
func (s *swrk) call(req *rpc.CriuReq, n Notify) (*rpc.CriuResp, error) {
	typ := req.GetType()
	for {
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		if _, err := s.sk.Write(b); err != nil {
			return nil, fmt.Errorf("send request: %w", err)
		}
		resp, err := s.recv()
		if err != nil {
			return nil, err
		}
		if !resp.GetSuccess() {
			return resp, fmt.Errorf("operation failed (msg:%s err:%d)", resp.GetCrErrmsg(), resp.GetCrErrno())
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			if resp.GetType() != typ {
				return resp, errors.New("unexpected CRIU RPC response")
			}
			return resp, nil
		}
		if n == nil {
			return resp, errors.New("unexpected notify")
		}
		if err := notify(n, resp.GetNotify()); err != nil {
			return resp, &NotifyError{Script: resp.GetNotify().GetScript(), Err: err}
		}
		req = &rpc.CriuReq{Type: rpc.CriuReqType_NOTIFY.Enum(), NotifySuccess: proto.Bool(true)}
	}
}

// NotifyError is gpucr's own answer to one of CRIU's notifications failing: the cause of
// the failed operation, whatever CRIU logs after it.
type NotifyError struct {
	Script string // CRIU's name for the notification: "post-restore", "post-dump", ...
	Err    error
}

func (e *NotifyError) Error() string { return e.Err.Error() }
func (e *NotifyError) Unwrap() error { return e.Err }

// recv reads CRIU's next message. The socket reads EOF once CRIU is gone.
func (s *swrk) recv() (*rpc.CriuResp, error) {
	buf := make([]byte, maxResp)
	n, err := s.sk.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("receive response: %w", err)
	}
	if n == len(buf) {
		return nil, fmt.Errorf("receive response: larger than %d bytes", maxResp)
	}
	resp := &rpc.CriuResp{}
	if err := proto.Unmarshal(buf[:n], resp); err != nil {
		return nil, fmt.Errorf("decode response: %w", err)
	}
	return resp, nil
}

// notify hands one of CRIU's notifications to n; one that Notify has no method for is
// answered as done.
func notify(n Notify, c *rpc.CriuNotify) error {
	switch c.GetScript() {
	case "pre-dump":
		return n.PreDump()
	case "post-dump":
		return n.PostDump()
	case "pre-restore":
		return n.PreRestore()
	case "post-restore":
		return n.PostRestore(c.GetPid())
	case "network-lock":
		return n.NetworkLock()
	case "network-unlock":
		return n.NetworkUnlock()
	case "setup-namespaces":
		return n.SetupNamespaces(c.GetPid())
	case "post-setup-namespaces":
		return n.PostSetupNamespaces()
	case "pre-resume":
		if r, ok := n.(ResumingNotify); ok {
			return r.PreResume()
		}
	case "post-resume":
		return n.PostResume()
	case "query-ext-files":
		if s, ok := n.(SeizedNotify); ok {
			return s.Seized()
		}
	}
	return nil
}

// kill stops CRIU wherever it is, and hangs up gpucr's end of the socket: tasks CRIU had
// forked hold copies of CRIU's end, and the read of an answer that never comes waited on
// them for good, through every Ctrl-C and SIGTERM (hostile test: a restored task blocked
// opening a FIFO). CRIU is gpucr's child, unwaited until close, so its PID names no other
// process.
func (s *swrk) kill() error {
	err := s.cmd.Process.Kill()
	if rc, cerr := s.sk.SyscallConn(); cerr == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
	}
	return err
}

// close hangs up on CRIU and waits for it to exit.
func (s *swrk) close() error {
	var errs []error
	if err := s.sk.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.cmd.Wait(); err != nil {
		errs = append(errs, fmt.Errorf("criu swrk failed: %w", err))
	}
	return errors.Join(errs...)
}
