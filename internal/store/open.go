package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// ErrBadLocation marks a location string gpucr cannot use; the CLI reports it as a usage error.
var ErrBadLocation = errors.New("invalid store location")

// Open resolves a location to a store and the key it names in that store. A location is
// s3://BUCKET[/KEY], opened with s3, or a local path. A local path is opened in a Dir
// rooted at "/", so that keys are absolute paths without their leading slash and sibling
// directories (where the chunks of a checkpoint go) are reachable from any location.
func Open(ctx context.Context, location string, s3 S3Config) (Store, string, error) {
	if rest, ok := strings.CutPrefix(location, "s3://"); ok {
		bucket, key, _ := strings.Cut(rest, "/")
		key = strings.Trim(key, "/")
		if bucket == "" || (key != "" && checkKey(key) != nil) {
			return nil, "", fmt.Errorf("%w %q: want s3://BUCKET/PREFIX with a clean PREFIX", ErrBadLocation, location)
		}
		// s3://HOST:PORT/... was taken for a bucket named HOST:PORT, asked of AWS (UX test).
		// The check is minio-go's lenient one: older buckets and some S3-compatible stores
		// have names with capitals or underscores, which S3 still serves.
		if strings.Contains(bucket, ":") {
			return nil, "", fmt.Errorf("%w %q: an endpoint is not part of the URL: set GPUCR_S3_ENDPOINT=http://%s and give s3://BUCKET/PREFIX", ErrBadLocation, location, bucket)
		}
		if err := s3utils.CheckValidBucketName(bucket); err != nil {
			return nil, "", fmt.Errorf("%w %q: %q is not a bucket name (%v)", ErrBadLocation, location, bucket, err)
		}
		s, err := NewS3(ctx, bucket, s3)
		if err != nil {
			return nil, "", err
		}
		return s, key, nil
	}
	if scheme, _, ok := strings.Cut(location, "://"); ok && !strings.Contains(scheme, "/") {
		return nil, "", fmt.Errorf("%w %q: only s3:// URLs and local paths are supported", ErrBadLocation, location)
	}
	if location == "" {
		return nil, "", fmt.Errorf("%w: empty location", ErrBadLocation)
	}
	abs, err := filepath.Abs(location)
	if err != nil {
		return nil, "", fmt.Errorf("resolve %s: %w", location, err)
	}
	return NewDir("/"), strings.TrimPrefix(filepath.ToSlash(abs), "/"), nil
}
