// Package storetest runs a real MinIO server on loopback for tests, so that the S3 backend
// is tested against a real S3 implementation rather than a fake. scripts/install-minio.sh
// (make deps) builds the server; without it tests skip, and under CI=true they fail.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/testutil"
)

// Fixed test credentials of every server this package starts; they guard nothing but a
// temporary directory on loopback.
const (
	AccessKey = "gpucr-test"
	SecretKey = "gpucr-test-secret"
)

// Server is a running MinIO server.
type Server struct {
	// Endpoint is the server's http:// URL.
	Endpoint string
	cmd      *exec.Cmd
}

// Binary finds the minio server: $GPUCR_MINIO, then where scripts/install-minio.sh puts
// it, then PATH; "" if none.
func Binary() string {
	if p := os.Getenv("GPUCR_MINIO"); p != "" {
		return p
	}
	cache := os.Getenv("GPUCR_BUILD_CACHE")
	if cache == "" {
		cache = "/var/cache/gpucr-build"
	}
	if p := filepath.Join(cache, "minio", "bin", "minio"); isExecutable(p) {
		return p
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p
	}
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// Start runs a MinIO server on a free loopback port with a temporary data directory and
// stops it when the test ends. Without a minio binary the test is skipped, or fails under
// CI=true.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		testutil.SkipOrFail(t, "no minio server: run scripts/install-minio.sh (make deps)")
	}
	addr, console := FreeAddr(t), FreeAddr(t)
	cmd := exec.Command(bin, "server", "--quiet", "--address", addr, "--console-address", console, t.TempDir())
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+AccessKey, "MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=1")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start minio: %v", err)
	}
	s := &Server{Endpoint: "http://" + addr, cmd: cmd}
	var waitErr error // read once exited is closed
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// MinIO's exit status after a signal says nothing about the tests.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.Endpoint + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && iamReady(s.Endpoint) {
				return s
			}
		}
		select {
		case <-exited:
			t.Fatalf("minio exited: %v\n%s", waitErr, log.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("minio not ready after 60s\n%s", log.String())
		}
	}
}

// FreeAddr is a loopback address with a port nothing listens on at the time of the call.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Config is the S3 configuration of the server with its test credentials.
func (s *Server) Config() store.S3Config {
	return store.S3Config{Endpoint: s.Endpoint, Creds: credentials.NewStaticV4(AccessKey, SecretKey, "")}
}

// Bucket creates a bucket with a fresh name and returns the name.
func (s *Server) Bucket(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := "gpucr-test-" + hex.EncodeToString(b)
	c, err := minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{Creds: s.Config().Creds})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket %s: %v", name, err)
	}
	return name
}

// Store opens a fresh bucket of the server as a store.
func (s *Server) Store(t testing.TB) *store.S3 {
	t.Helper()
	st, err := store.NewS3(context.Background(), s.Bucket(t), s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Env is the environment that points gpucr's CLI at the server with its credentials.
func (s *Server) Env() []string {
	return []string{"GPUCR_S3_ENDPOINT=" + s.Endpoint, "AWS_ACCESS_KEY_ID=" + AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=us-east-1"}
}

// iamReady says whether MinIO has loaded its identities: "ready" comes first, and until
// then a request with an unknown key is answered XMinioIAMNotInitialized instead of
// InvalidAccessKeyId (a CI run met it in TestS3Refusals).
func iamReady(endpoint string) bool {
	c, err := minio.New(strings.TrimPrefix(endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4("gpucr-probe", "gpucr-probe-secret", "")})
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.ListBuckets(ctx)
	return minio.ToErrorResponse(err).Code != "XMinioIAMNotInitialized"
}
