package criu

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// fakeCRIU plays CRIU's side of the socket: it sends each of msgs after reading one
// request, and records the requests.
func fakeCRIU(t *testing.T, msgs ...*rpc.CriuResp) (*swrk, <-chan []*rpc.CriuReq) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "gpucr"), os.NewFile(uintptr(fds[1]), "criu")
	t.Cleanup(func() { ours.Close() })
	got := make(chan []*rpc.CriuReq, 1)
	go func() {
		defer theirs.Close()
		var reqs []*rpc.CriuReq
		defer func() { got <- reqs }()
		buf := make([]byte, 4096)
		for _, m := range msgs {
			n, err := theirs.Read(buf)
			if err != nil {
				return
			}
			req := &rpc.CriuReq{}
			if err := proto.Unmarshal(buf[:n], req); err != nil {
				return
			}
			reqs = append(reqs, req)
			b, _ := proto.Marshal(m)
			if _, err := theirs.Write(b); err != nil {
				return
			}
		}
	}()
	return &swrk{sk: ours}, got
}

func notifyMsg(script string, pid int32) *rpc.CriuResp {
	return &rpc.CriuResp{Type: rpc.CriuReqType_NOTIFY.Enum(), Success: proto.Bool(true),
		Notify: &rpc.CriuNotify{Script: proto.String(script), Pid: proto.Int32(pid)}}
}

func restored(pid int32) *rpc.CriuResp {
	return &rpc.CriuResp{Type: rpc.CriuReqType_RESTORE.Enum(), Success: proto.Bool(true),
		Restore: &rpc.CriuRestoreResp{Pid: proto.Int32(pid)}}
}

type recorder struct {
	NoNotify
	calls []string
	fail  error
}

func (r *recorder) PreRestore() error {
	r.calls = append(r.calls, "pre-restore")
	return nil
}

func (r *recorder) PostRestore(pid int32) error {
	r.calls = append(r.calls, fmt.Sprint("post-restore ", pid))
	return r.fail
}

// call answers each notification through the Notify and then with notify_success, and
// returns CRIU's final response; a failed notification, a refusal or a response of the
// wrong type ends the exchange with an error.
func TestCallSpeaksCRIUsProtocol(t *testing.T) {
	refused := &rpc.CriuResp{Type: rpc.CriuReqType_RESTORE.Enum(), Success: proto.Bool(false),
		CrErrno: proto.Int32(2), CrErrmsg: proto.String("no images")}
	wrongType := &rpc.CriuResp{Type: rpc.CriuReqType_DUMP.Enum(), Success: proto.Bool(true)}
	tests := []struct {
		name    string
		msgs    []*rpc.CriuResp
		fail    error
		calls   []string
		replies int // requests CRIU reads after the first: the notify_success answers
		wantErr string
	}{
		{"notifications answered", []*rpc.CriuResp{notifyMsg("pre-restore", 0), notifyMsg("orphan-pts-master", 0), notifyMsg("post-restore", 7), restored(7)},
			nil, []string{"pre-restore", "post-restore 7"}, 3, ""},
		{"notification fails", []*rpc.CriuResp{notifyMsg("post-restore", 7), restored(7)},
			errors.New("image damaged"), []string{"post-restore 7"}, 0, "image damaged"},
		{"refused", []*rpc.CriuResp{refused}, nil, nil, 0, "operation failed (msg:no images err:2)"},
		{"wrong response", []*rpc.CriuResp{wrongType}, nil, nil, 0, "unexpected CRIU RPC response"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, got := fakeCRIU(t, tt.msgs...)
			n := &recorder{fail: tt.fail}
			resp, err := s.call(&rpc.CriuReq{Type: rpc.CriuReqType_RESTORE.Enum()}, n)
			s.sk.Close()
			reqs := <-got
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("call = %v, want an error with %q", err, tt.wantErr)
				}
			} else if err != nil || resp.GetRestore().GetPid() != 7 {
				t.Fatalf("call = %v, %v; want the restore response", resp, err)
			}
			if strings.Join(n.calls, ",") != strings.Join(tt.calls, ",") {
				t.Errorf("notified %q, want %q", n.calls, tt.calls)
			}
			if len(reqs) == 0 || reqs[0].GetType() != rpc.CriuReqType_RESTORE {
				t.Fatalf("CRIU read %v, want the restore request first", reqs)
			}
			if len(reqs)-1 != tt.replies {
				t.Fatalf("CRIU read %d answers to notifications, want %d", len(reqs)-1, tt.replies)
			}
			for _, r := range reqs[1:] {
				if r.GetType() != rpc.CriuReqType_NOTIFY || !r.GetNotifySuccess() {
					t.Errorf("answer to a notification = %v, want notify_success", r)
				}
			}
		})
	}
}

// A CRIU that dies mid-exchange ends the wait instead of leaving gpucr blocked.
func TestCallEndsWhenCRIUIsGone(t *testing.T) {
	s, got := fakeCRIU(t, notifyMsg("pre-restore", 0))
	_, err := s.call(&rpc.CriuReq{Type: rpc.CriuReqType_RESTORE.Enum()}, NoNotify{})
	<-got
	if err == nil {
		t.Fatal("call succeeded with CRIU gone")
	}
}
