package chunked

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/parallel"
	"github.com/gpucr/gpucr/internal/store"
)

// Collected is what a collection found and removed in one store directory.
type Collected struct {
	Checkpoints  int   // complete checkpoints whose chunks were kept
	Kept         int   // chunks they reference
	Removed      int   // chunks no checkpoint references, removed
	RemovedBytes int64 // their stored size
	// Stopped is set when a push started meanwhile: the collection stopped for it, and
	// some unreferenced chunks may remain.
	Stopped bool
}

// ErrNotStore means a collection was pointed at a directory that holds what gpucr never
// writes in a store's chunks/: a directory of the user's, not a store.
var ErrNotStore = errors.New("not a gpucr store")

// collectBatch is how many chunks a collection removes between two looks for a push.
const collectBatch = 64

// Collect removes the chunks in dir's chunks/ directory that no complete checkpoint
// directly under dir references: those of deleted checkpoints and of pushes that never
// finished, with the pieces of writes those left in a store that keeps them. It refuses
// to start while a push or another collection works in dir, stops between batches for a
// push that starts, and removes nothing if any checkpoint's manifest cannot be read (its
// chunks are unknown). With dryRun it only counts.
func Collect(ctx context.Context, st store.Store, dir string, dryRun bool) (*Collected, error) {
	return collect(ctx, st, dir, dryRun, false)
}

// collect is Collect; known says dir is a store already (a checkpoint was just deleted from
// it), which may have no chunks/ (a checkpoint of zeros stores none).
func collect(ctx context.Context, st store.Store, dir string, dryRun, known bool) (*Collected, error) {
	if err := checkStore(ctx, st, dir, known); err != nil {
		return nil, err
	}
	// A dry run removes nothing, so it needs no lease: it counts on a store too full to take
	// one (a hostile test's full store could not even be looked at).
	var l *lease
	var mark int
	if !dryRun {
		var err error
		l, err = takeLease(ctx, st, dir, kindCollect)
		if store.Full(err) {
			return nil, fmt.Errorf("%s is too full to store the collection's lease, and without one it may remove no chunk (a push starting meanwhile could reuse it); nothing was removed: make room on the store's disk, then run gc again: %w", st.URL(dir), err)
		}
		if err != nil {
			return nil, err
		}
		defer l.release()
		if err := idle(ctx, l); err != nil {
			return nil, err
		}
		// What follows rests on no push having run since this look: true while the lease
		// stays live, and no longer once it lapses (a push that starts then takes the
		// collection for dead, and what is referenced changes under it).
		mark = l.mark()
	}
	c := &Collected{}
	refs, prefixes, err := referenced(ctx, st, dir, c)
	if err != nil {
		return nil, err
	}
	chunks, err := st.List(ctx, chunksKey(dir))
	if err != nil {
		return nil, err
	}
	var unref []store.Entry
	for _, e := range chunks {
		if !e.Dir && !refs[e.Name()] { // a directory is no chunk, and not ours to remove
			unref = append(unref, e)
		}
	}
	// No push works here: what killed ones were writing is litter — a chunk in chunks/, a
	// manifest object in a checkpoint's directory, and nothing else: the store directory's
	// other folders are anyone's (a hostile test's rm of /home/x swept every home's
	// .NAME.tmp-* files).
	if pl, ok := st.(store.PartialLister); ok {
		for _, d := range append(prefixes, chunksKey(dir)) {
			partial, err := pl.Partial(ctx, d)
			if err != nil {
				return nil, err
			}
			for _, e := range partial {
				object, _ := store.PartialOf(e.Name())
				if d == chunksKey(dir) && image.IsSHA256(object) || d != chunksKey(dir) && object == ManifestObject {
					unref = append(unref, e)
				}
			}
		}
	}
	if dryRun {
		for _, e := range unref {
			c.Removed, c.RemovedBytes = c.Removed+1, c.RemovedBytes+e.Size
		}
		return c, nil
	}
	for len(unref) > 0 {
		if err := idle(ctx, l); errors.Is(err, ErrBusy) {
			c.Stopped = true
			return c, nil
		} else if err != nil {
			return c, err
		}
		if live, _ := l.liveSince(mark); !live {
			c.Stopped = true // what the chunks were checked against may be out of date
			return c, nil
		}
		batch := unref[:min(collectBatch, len(unref))]
		removed, left, err := removeWhileLive(ctx, st, l, mark, batch)
		for _, e := range removed {
			c.Removed, c.RemovedBytes = c.Removed+1, c.RemovedBytes+e.Size
		}
		if err != nil {
			return c, err
		}
		unref = append(left, unref[len(batch):]...)
	}
	return c, nil
}

// removeWhileLive deletes batch's objects, each only while the collection's lease l surely
// counts as live and has since mark: a push that began while it was stale took the
// collection for dead and may reuse any of them. A collection stopped or slowed past that
// removed a chunk a push it had not seen then named in its manifest (review). It returns
// what it removed and, in order, what it left.
func removeWhileLive(ctx context.Context, st store.Store, l *lease, mark int, batch []store.Entry) (removed, left []store.Entry, err error) {
	done := make([]bool, len(batch))
	idx := make([]int, len(batch))
	for i := range idx {
		idx[i] = i
	}
	err = parallel.Each(ctx, idx, listWorkers, func() struct{} { return struct{}{} }, func(ctx context.Context, i int, _ struct{}) error {
		live, until := l.liveSince(mark)
		if !live {
			return nil // left: the collection stops
		}
		dctx, cancel := context.WithDeadline(ctx, until)
		defer cancel()
		err := st.Delete(dctx, batch[i].Key)
		if err != nil && dctx.Err() != nil && ctx.Err() == nil {
			return nil // cut off as the lease's sure life ended: left
		}
		done[i] = err == nil
		return err
	})
	for i, e := range batch {
		if done[i] {
			removed = append(removed, e)
		} else {
			left = append(left, e)
		}
	}
	return removed, left, err
}

// checkStore refuses a directory that holds things but no chunks/ or leases (unless known
// to be a store), or whose chunks/ holds files other than chunks, before anything is written
// there: it is someone's own directory, not a store, and a collection would remove their
// files. An empty one has nothing to lose (a store before its first push). Directories in
// chunks/ are passed over, never removed: a checkpoint put there before the directory held
// chunks blocked every collection of the store for good (hostile test).
func checkStore(ctx context.Context, st store.Store, dir string, known bool) error {
	if err := trustStore(ctx, st, dir); err != nil {
		return err
	}
	top, err := st.List(ctx, dir)
	if err != nil {
		return err
	}
	ours := func(e store.Entry) bool { return e.Dir && (e.Name() == ChunksDir || e.Name() == LeasesDir) }
	if !known && len(top) > 0 && !slices.ContainsFunc(top, ours) {
		return fmt.Errorf("%w: %s has no %s/; nothing was removed", ErrNotStore, st.URL(dir), ChunksDir)
	}
	chunks, err := st.List(ctx, chunksKey(dir))
	if err != nil {
		return err
	}
	for _, e := range chunks {
		if !e.Dir && !image.IsSHA256(e.Name()) {
			return fmt.Errorf("%w: %s holds %q, which is no chunk; nothing was removed", ErrNotStore, st.URL(chunksKey(dir)), e.Name())
		}
	}
	return nil
}

// ErrUntrusted means a collection was pointed at a directory whose listing a user other than
// the caller can change: it would trust that listing to tell what is still referenced.
var ErrUntrusted = errors.New("store directory others can rename in")

// trustStore asks a store whose listings others may change (a local directory) whether
// the listings a collection of dir reads can be trusted: dir's, its chunks/' and each of
// its directories' (a checkpoint's, or one a user renamed a checkpoint to).
func trustStore(ctx context.Context, st store.Store, dir string) error {
	if _, ok := st.(store.ListingGuard); !ok {
		return nil
	}
	dirs := []string{dir, chunksKey(dir)}
	entries, err := st.List(ctx, dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Dir {
			dirs = append(dirs, e.Key)
		}
	}
	for _, d := range dirs {
		if err := trustListing(st, d); err != nil {
			return err
		}
	}
	return nil
}

// trustListing asks a store whose listings others may change (a local directory) whether
// dir's can be trusted.
func trustListing(st store.Store, dir string) error {
	g, ok := st.(store.ListingGuard)
	if !ok {
		return nil
	}
	if err := g.TrustListing(dir); err != nil {
		return fmt.Errorf("%w: %v: a user who can rename what it holds could hide a checkpoint from the collection, which would then remove its chunks; nothing was removed (collect as that user, or make it root's)", ErrUntrusted, err)
	}
	return nil
}

// idle fails with ErrBusy, naming them, if others hold leases in l's directory.
func idle(ctx context.Context, l *lease) error {
	hs, err := l.others(ctx)
	if err != nil {
		return fmt.Errorf("look for pushes in %s: %w", l.st.URL(leasesKey(l.dir)), err)
	}
	if len(hs) == 0 {
		return nil
	}
	names := make([]string, len(hs))
	for i, h := range hs {
		names[i] = h.String()
	}
	return fmt.Errorf("%w: %s works in %s; run again once it is done", ErrBusy, strings.Join(names, ", "), l.st.URL(l.dir))
}

// referenced returns the chunks (by sha256) the complete checkpoints directly under dir
// reference, counting them into c, and the prefixes it looked at. A manifest that cannot be
// read fails it.
func referenced(ctx context.Context, st store.Store, dir string, c *Collected) (map[string]bool, []string, error) {
	entries, err := st.List(ctx, dir)
	if err != nil {
		return nil, nil, err
	}
	refs := map[string]bool{}
	var prefixes []string
	for _, e := range entries {
		if !e.Dir || e.Name() == ChunksDir || e.Name() == LeasesDir {
			continue
		}
		prefixes = append(prefixes, e.Key)
		m, err := Load(ctx, st, e.Key)
		if errors.Is(err, ErrNoCheckpoint) {
			continue // an unfinished push: its chunks are what this collects
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w; nothing was removed", st.URL(path.Clean(e.Key)), err)
		}
		c.Checkpoints++
		for _, f := range m.Files {
			for _, ch := range f.Chunks {
				if !ch.Zero && !refs[ch.SHA256] {
					refs[ch.SHA256] = true
					c.Kept++
				}
			}
		}
	}
	return refs, prefixes, nil
}

// Delete removes the checkpoint at prefix — its manifest object, which alone makes it one —
// and then collects the chunks of its directory. Checkpoints nested under prefix stay.
func Delete(ctx context.Context, st store.Store, prefix string) (*Collected, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	if _, err := Load(ctx, st, prefix); err != nil && !Unusable(err) {
		return nil, err
	}
	// The collection that follows would refuse: refused before anything is deleted.
	if err := trustStore(ctx, st, ParentDir(prefix)); err != nil {
		return nil, err
	}
	if err := st.Delete(ctx, ManifestKey(prefix)); err != nil {
		return nil, err
	}
	c, err := collect(ctx, st, ParentDir(prefix), false, true)
	if err != nil {
		return nil, fmt.Errorf("%s was deleted, but its chunks stay until `gpucr gc %s`: %w", st.URL(prefix), st.URL(ParentDir(prefix)), err)
	}
	return c, nil
}
