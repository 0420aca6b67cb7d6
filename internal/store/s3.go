package store

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config says where an S3-compatible service is and who we are there. It never holds
// credentials in the clear: Creds resolves them when a request is signed.
type S3Config struct {
	// Endpoint is the service's http:// or https:// URL; empty means AWS S3.
	Endpoint string
	// Region is the bucket's region; empty lets the client ask the service.
	Region string
	Creds  *credentials.Credentials
}

// Timeouts of the S3 client. They are short on purpose: an endpoint that does not answer
// a connection in seconds is down or wrong, and a user should hear so at once rather than
// after minutes of retries. Transfers themselves are not limited in time, only in how long
// they may move nothing (stallTimeout).
const (
	dialTimeout   = 5 * time.Second
	headerTimeout = 60 * time.Second
	checkTimeout  = 15 * time.Second
	// maxRetries counts attempts: a request is tried 3 times with sub-second backoff.
	maxRetries = 3
)

// S3 is a store in one bucket of an S3-compatible service; keys are object names.
type S3 struct {
	client   *minio.Client
	core     minio.Core // the same client's single requests: one PUT, one GET
	bucket   string
	endpoint string
	// anonymous records that no credential source was configured, so that a refusal can
	// say so instead of only "access denied".
	anonymous bool
}

// noCredentials reports whether creds resolve to no credentials at all.
func noCredentials(creds *credentials.Credentials) bool {
	if creds == nil {
		return true
	}
	v, err := creds.GetWithContext(nil) // nil: the provider's own HTTP client and endpoint
	return err != nil || v.SignerType.IsAnonymous()
}

// NewS3 connects to bucket and checks, within seconds, that the endpoint answers, that it
// takes our credentials and that the bucket exists, so that a push or pull fails before it
// has read anything.
func NewS3(ctx context.Context, bucket string, cfg S3Config) (*S3, error) {
	host, secure, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialStalling((&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext),
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: headerTimeout,
		// The pool, not the stall guard, ends idle connections: one the guard ended just as
		// a request took it from the pool failed that request (review).
		IdleConnTimeout:     stallTimeout / 2,
		MaxIdleConnsPerHost: 32,
		// HTTP/1.1: each transfer has a connection of its own, so that the stall guard,
		// which watches connections, sees each transfer stall. HTTP/2 would carry every
		// upload on one connection, where the others' bytes would hide one that stalled.
		ForceAttemptHTTP2: false,
	}
	client, err := minio.New(host, &minio.Options{
		Creds:        cfg.Creds,
		Secure:       secure,
		Region:       cfg.Region,
		Transport:    tr,
		BucketLookup: minio.BucketLookupAuto,
		MaxRetries:   maxRetries,
	})
	if err != nil {
		return nil, fmt.Errorf("s3://%s: %w", bucket, err)
	}
	s := &S3{client: client, core: minio.Core{Client: client}, bucket: bucket, endpoint: client.EndpointURL().String(), anonymous: noCredentials(cfg.Creds)}
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	ok, err := client.BucketExists(cctx, bucket)
	if err != nil {
		return nil, s.wrap("open", "", err)
	}
	if !ok {
		return nil, fmt.Errorf("s3://%s: bucket does not exist at %s", bucket, s.endpoint)
	}
	return s, nil
}

// parseEndpoint turns an endpoint URL into minio-go's host and TLS switch.
func parseEndpoint(endpoint string) (host string, secure bool, err error) {
	if endpoint == "" {
		return "s3.amazonaws.com", true, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("S3 endpoint %q must be an http:// or https:// URL of a host (GPUCR_S3_ENDPOINT or AWS_ENDPOINT_URL)", endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

func (s *S3) URL(key string) string { return "s3://" + s.bucket + "/" + key }

func (s *S3) Put(ctx context.Context, key string, data []byte) error {
	return s.put(ctx, key, data, crc32.Checksum(data, castagnoli), minio.PutObjectOptions{})
}

// PutChecked is Put with data's CRC32C given (Checksummed).
func (s *S3) PutChecked(ctx context.Context, key string, data []byte, crc32c uint32) error {
	return s.put(ctx, key, data, crc32c, minio.PutObjectOptions{})
}

// Create asks the service to refuse an existing key (If-None-Match: *), which AWS S3 and
// MinIO honour; a service that ignores it replaces the object as Put does.
func (s *S3) Create(ctx context.Context, key string, data []byte) error {
	opts := minio.PutObjectOptions{}
	opts.SetMatchETagExcept("*")
	return s.put(ctx, key, data, crc32.Checksum(data, castagnoli), opts)
}

// castagnoli is CRC32C's table, the checksum S3 services verify in hardware-friendly form.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// put sends data in one plain request whose x-amz-checksum-crc32c header (sum, data's
// CRC32C) the service checks the body against, refusing the object if they differ. The
// whole object is in memory, so its CRC32C is known before it is sent: the streamed form a
// client otherwise needs for a checksum (aws-chunked with a trailer) copies every byte
// twice more on the client, and the service parses it (a push to MinIO on loopback: 8%
// less of gpucr's CPU, docs/storage.md).
func (s *S3) put(ctx context.Context, key string, data []byte, sum uint32, opts minio.PutObjectOptions) error {
	if err := checkKey(key); err != nil {
		return err
	}
	opts.ContentType = "application/octet-stream"
	// Not a SHA-256 of the payload in its signature, which plain HTTP otherwise gets: with
	// it both ends hash every byte of a checkpoint once more, at a fraction of the speed
	// (chunks carry their own digests, checked on every read).
	opts.DisableContentSha256 = true
	opts.UserMetadata = map[string]string{crc32cHeader: base64.StdEncoding.EncodeToString(binary.BigEndian.AppendUint32(nil, sum))}
	if _, err := s.core.PutObject(ctx, s.bucket, key, bytes.NewReader(data), int64(len(data)), "", "", opts); err != nil {
		return s.wrap("write", key, err)
	}
	return nil
}

// crc32cHeader carries an object's CRC32C, base64 of its 4 big-endian bytes (S3's
// flexible checksums).
const crc32cHeader = "x-amz-checksum-crc32c"

func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	body, _, _, err := s.core.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.wrap("read", key, err)
	}
	return &s3Object{ReadCloser: body, s: s, key: key}, nil
}

// s3Object reports its read errors as every other call does.
type s3Object struct {
	io.ReadCloser
	s   *S3
	key string
}

func (o *s3Object) Read(b []byte) (int, error) {
	n, err := o.ReadCloser.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		err = o.s.wrap("read", o.key, err)
	}
	return n, err
}

func (s *S3) Stat(ctx context.Context, key string) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return 0, s.wrap("stat", key, err)
	}
	return info.Size, nil
}

func (s *S3) List(ctx context.Context, dir string) ([]Entry, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	var out []Entry
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if obj.Err != nil {
			return nil, s.wrap("list", dir, obj.Err)
		}
		switch {
		case obj.Key == prefix:
			// A "folder" an S3 console or sync tool made (an empty object DIR/) is the
			// listed directory itself, not an entry of it.
		case strings.HasSuffix(obj.Key, "/"):
			out = append(out, Entry{Key: strings.TrimSuffix(obj.Key, "/"), Dir: true})
		default:
			out = append(out, Entry{Key: obj.Key, Size: obj.Size, Modified: obj.LastModified})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return s.wrap("delete", key, err)
	}
	return nil
}

// wrap turns a client error into one line that says what failed and what to look at,
// with ErrNotFound and ErrExists for callers. Credentials are never part of it.
func (s *S3) wrap(op, key string, err error) error {
	what := "s3://" + s.bucket
	if key != "" {
		what = s.URL(key)
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) {
		switch resp.Code {
		case minio.NoSuchKey:
			return fmt.Errorf("%s: %w", what, ErrNotFound)
		case "PreconditionFailed":
			return fmt.Errorf("%s: %w", what, ErrExists)
		case "XMinioStorageFull":
			return fmt.Errorf("%s %s: %w (%s)", op, what, ErrFull, resp.Message)
		case minio.NoSuchBucket:
			return fmt.Errorf("%s: bucket does not exist at %s", what, s.endpoint)
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "InvalidClientTokenId":
			hint := "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials"
			if s.anonymous {
				hint = "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
			}
			return fmt.Errorf("%s: %s refused our credentials (%s): %s", what, s.endpoint, resp.Code, hint)
		}
		return fmt.Errorf("%s %s: %s: %s", op, what, resp.Code, resp.Message)
	}
	if errors.Is(err, ErrStalled) {
		return fmt.Errorf("%s %s: %w", op, what, err)
	}
	var netErr net.Error
	var opErr *net.OpError
	if errors.As(err, &opErr) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return fmt.Errorf("%s %s: cannot reach %s: %w", op, what, s.endpoint, err)
	}
	return fmt.Errorf("%s %s: %w", op, what, err)
}
