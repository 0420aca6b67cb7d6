package chunked

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/gpucr/gpucr/internal/store"
)

// maxManifest bounds how much of a manifest object is read: a corrupt or hostile object
// must not exhaust memory. 64 MiB is over 200,000 chunks' entries, about a terabyte of image.
const maxManifest = 64 << 20

// maxManifestObjects bounds the JSON objects (chunk entries, files, the image's pieces) a
// manifest object may hold: decoded, each costs ~100 bytes however short it is, and 63 MiB
// of empty entries took 5 GB in a hostile test. A million is over three terabytes of image.
// maxManifestValues bounds its values the same way (a comma before each but the first of
// an object or array): a second hostile test's entries were nulls in an array, which open
// no object, 13 million of them decoded to 88 bytes each. A real entry holds four or five.
const (
	maxManifestObjects = 1 << 20
	maxManifestValues  = 6 << 20
)

// Load reads and checks the manifest object of the checkpoint at prefix.
func Load(ctx context.Context, st store.Store, prefix string) (*Manifest, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	key := ManifestKey(prefix)
	var b []byte
	r, err := st.Get(ctx, key)
	if err == nil {
		b, err = io.ReadAll(io.LimitReader(r, maxManifest+1))
		r.Close()
	}
	if errors.Is(err, store.ErrNotObject) { // there, but no object: not an interrupted push
		return nil, fmt.Errorf("read %s: %w", st.URL(key), err)
	}
	if errors.Is(err, store.ErrNotFound) { // never there, or deleted while read
		return nil, fmt.Errorf("%s: %w (no %s: nothing was pushed there, or a push was interrupted)",
			st.URL(prefix), ErrNoCheckpoint, ManifestObject)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", st.URL(key), err)
	}
	if len(b) > maxManifest {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", st.URL(key), ErrBadManifest, maxManifest)
	}
	// Every object opens with a brace (one inside a string only counts it higher).
	if n := bytes.Count(b, []byte("{")); n > maxManifestObjects {
		return nil, fmt.Errorf("%s: %w: %d entries, more than the %d a checkpoint of this format has", st.URL(key), ErrBadManifest, n, maxManifestObjects)
	}
	if n := bytes.Count(b, []byte(",")); n > maxManifestValues {
		return nil, fmt.Errorf("%s: %w: %d values, more than the %d a checkpoint of this format has", st.URL(key), ErrBadManifest, n, maxManifestValues)
	}
	// The format is read alone first: a newer one may not decode as this one.
	var head struct {
		Format int `json:"format"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", st.URL(key), ErrBadManifest, err)
	}
	if head.Format > FormatVersion {
		return nil, fmt.Errorf("%s: %w: format %d, this gpucr reads up to %d; upgrade gpucr",
			st.URL(key), ErrNewerFormat, head.Format, FormatVersion)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", st.URL(key), ErrBadManifest, err)
	}
	if reason := m.problem(); reason != "" {
		return nil, fmt.Errorf("%s: %w: %s", st.URL(key), ErrBadManifest, reason)
	}
	return &m, nil
}

// Listed is one checkpoint found by List. Problem is set, and Manifest nil, for a manifest
// object that exists but cannot be used.
type Listed struct {
	Prefix   string
	Manifest *Manifest
	Problem  string
}

// listWorkers bounds the manifests List fetches at once.
const listWorkers = 8

// List finds the complete checkpoints at dir: dir itself if it is one, otherwise those
// directly under it. Prefixes without a manifest object (chunks/, unrelated data and
// interrupted pushes) are not checkpoints and are left out.
func List(ctx context.Context, st store.Store, dir string) ([]Listed, error) {
	if checkPrefix(dir) == nil {
		m, err := Load(ctx, st, dir)
		switch {
		case err == nil:
			return []Listed{{Prefix: dir, Manifest: m}}, nil
		case Unusable(err):
			return []Listed{{Prefix: dir, Problem: err.Error()}}, nil
		case !errors.Is(err, ErrNoCheckpoint):
			return nil, err
		}
	}
	entries, err := st.List(ctx, dir)
	if err != nil {
		return nil, err
	}
	var prefixes []string
	for _, e := range entries {
		if e.Dir && e.Name() != ChunksDir && e.Name() != LeasesDir {
			prefixes = append(prefixes, e.Key)
		}
	}
	found := make([]*Listed, len(prefixes))
	errs := make([]error, len(prefixes))
	sem := make(chan struct{}, listWorkers)
	var wg sync.WaitGroup
	for i, p := range prefixes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			m, err := Load(ctx, st, p)
			switch {
			case err == nil:
				found[i] = &Listed{Prefix: p, Manifest: m}
			case errors.Is(err, ErrNoCheckpoint):
			case Unusable(err):
				found[i] = &Listed{Prefix: p, Problem: err.Error()}
			default:
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	var out []Listed
	for i, l := range found {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if l != nil {
			out = append(out, *l)
		}
	}
	return out, nil
}

// Unusable tells a manifest object List shows as a problem from a failure of the store.
func Unusable(err error) bool {
	return errors.Is(err, ErrBadManifest) || errors.Is(err, ErrNewerFormat)
}
