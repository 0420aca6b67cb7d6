package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// stallTimeout is how long a connection to a service may move no byte either way before it
// is given up. Without it a service that stops reading an upload, or stops sending a
// download midway, holds the transfer for good: a streamed checkpoint then keeps its
// workload frozen, and a streamed restore its restored tasks, with nothing to end it. It is
// no shorter than headerTimeout, the time a service may think before it answers.
var stallTimeout = headerTimeout

// ErrStalled is a connection to the store that moved no byte for stallTimeout.
var ErrStalled = errors.New("the store stopped answering")

// dialStalling dials with dial and guards each connection with stallConn.
func dialStalling(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newStallConn(c, stallTimeout)
	}
}

// stallConn is a connection whose deadline moves on each time a read or a write moves a
// byte: it times out only when nothing moved either way for limit. One deadline serves both
// directions: an upload the service is slow to answer still moves bytes, and its response's
// read, pending all along, must not time out meanwhile.
type stallConn struct {
	net.Conn
	limit   time.Duration
	stalled atomic.Bool // the deadline passed: what fails after is the stall too
}

func newStallConn(c net.Conn, limit time.Duration) (*stallConn, error) {
	s := &stallConn{Conn: c, limit: limit}
	if err := s.moved(); err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

func (s *stallConn) moved() error { return s.SetDeadline(time.Now().Add(s.limit)) }

func (s *stallConn) Read(b []byte) (int, error) {
	n, err := s.Conn.Read(b)
	if n > 0 {
		_ = s.moved() // a closed connection says so at its next call
	}
	return n, s.explain(err)
}

func (s *stallConn) Write(b []byte) (int, error) {
	// A large write moves bytes long before it returns: written in pieces, each extends the
	// deadline.
	var done int
	for done < len(b) {
		n, err := s.Conn.Write(b[done:min(len(b), done+stallPiece)])
		done += n
		if n > 0 {
			_ = s.moved()
		}
		if err != nil {
			return done, s.explain(err)
		}
	}
	return done, nil
}

// stallPiece is how much of a write goes to the connection at once.
const stallPiece = 1 << 20

// explain names a deadline passed as the stall it is, and so an error of the other
// direction, which the client's closing of the stalled connection caused.
func (s *stallConn) explain(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.stalled.Store(true)
	}
	if err != nil && s.stalled.Load() {
		return fmt.Errorf("%w: no byte moved to or from %s for %v: %w", ErrStalled, s.RemoteAddr(), s.limit, err)
	}
	return err
}
