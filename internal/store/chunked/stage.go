package chunked

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"

	"github.com/dustin/go-humanize"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
)

// ErrTooMuchLocal means a checkpoint keeps more in CRIU's own files than a streamed restore
// may put on local disk: it is restored from a pulled image instead.
var ErrTooMuchLocal = errors.New("too much of the checkpoint is outside the memory gpucr streams")

// The local disk a streamed restore may use: LocalShare of the image, at most LocalMost,
// and never less than LocalLeast (a small process's CRIU files are most of its image).
const (
	LocalShare = 20 // one twentieth: 5%
	LocalMost  = 1 << 30
	LocalLeast = 32 << 20
)

// LocalBound is the most local disk a streamed restore of an image of size bytes uses.
func LocalBound(size int64) int64 { return max(LocalLeast, min(size/LocalShare, LocalMost)) }

// Staged is a stored checkpoint made ready for a streamed restore: every file but the
// memory gpucr saved (criuimg.MemDir) fetched into Dir, and that memory served by Memory
// as the restore's fill reads it.
type Staged struct {
	Dir    string
	Memory *Memory
	Stats  Stats // of the files fetched into Dir
	// Local is the local disk the fetched files take, within Bound, LocalBound of the image.
	// The restore copies CRIU's page files without the long runs it fills itself only
	// where that copy fits in what is left (Bound - Local): it is a gain of speed alone.
	Local, Bound int64
}

// Stage fetches the checkpoint at prefix for a streamed restore into a new directory under
// parent (the system's temporary directory when ""): CRIU's files and gpucr's manifest,
// in the order the manifest lists them, each chunk checked as it arrives, and the image's
// manifest checked (o.Trust) before the Memory is built from it. A checkpoint whose files
// outside the memory take more local disk than LocalBound allows is refused with
// ErrTooMuchLocal before anything is fetched. Close removes what Stage made.
func Stage(ctx context.Context, st store.Store, prefix, parent string, o Options) (*Staged, error) {
	m, err := Load(ctx, st, prefix)
	if err != nil {
		return nil, err
	}
	local, need, all := localPart(m, len(o.Trust) > 0)
	if bound := LocalBound(all); need > bound {
		return nil, fmt.Errorf("%s: %w: CRIU's files need %s of local disk, a streamed restore uses at most %s "+
			"(5%% of the image, at most 1 GiB); fetch it with gpucr pull URL DIR and restore -D DIR",
			st.URL(prefix), ErrTooMuchLocal, humanize.IBytes(uint64(need)), humanize.IBytes(uint64(bound)))
	}
	// Within the bound, what is fetched must also fit where it goes: a manifest object can
	// list one small chunk at many places (a hostile test filled root's TMPDIR so).
	room := parent
	if room == "" {
		room = os.TempDir()
	}
	if err := diskroom.Check(room, written(local)); err != nil {
		return nil, fmt.Errorf("%s: streamed restore: %w", st.URL(prefix), err)
	}
	dir, err := os.MkdirTemp(parent, "gpucr-stream-*")
	if err != nil {
		return nil, fmt.Errorf("streamed restore: %w", err)
	}
	s := &Staged{Dir: dir, Local: need, Bound: LocalBound(all)}
	if err := s.fetch(ctx, st, prefix, m, local, o); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Staged) fetch(ctx context.Context, st store.Store, prefix string, m *Manifest, local []File, o Options) error {
	sub := *m
	sub.Files = local
	p := &puller{st: st, prefix: prefix, m: &sub, o: o, stats: Stats{Files: len(local)}}
	defer p.close()
	if err := p.create(s.Dir); err != nil {
		return err
	}
	crashpoint.Hit("in fetch")
	if len(o.Trust) > 0 {
		// Signature and listing first, as a pull does: an untrusted store gets nothing else
		// fetched (a hostile test's had up to 1 GiB staged before the signature was read).
		if err := p.signedFirst(ctx, s.Dir); err != nil {
			return err
		}
		p.only = func(path string) bool { return !isManifestFile(path) }
	}
	if err := p.run(ctx); err != nil {
		return err
	}
	s.Stats = p.stats
	im, _, err := image.LoadTrusted(s.Dir, o.Trust)
	if errors.Is(err, signing.ErrUntrusted) {
		return fmt.Errorf("%s: %w", st.URL(prefix), err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", st.URL(prefix), err)
	}
	s.Memory, err = newMemory(st, prefix, m, im, o)
	return err
}

// Close removes the fetched files.
func (s *Staged) Close() {
	if s.Memory != nil {
		s.Memory.Close()
	}
	os.RemoveAll(s.Dir)
}

// localPart returns the files of m a streamed restore fetches (all but the memory gpucr
// saved, and what pulled leaves out), the local disk they need, and the image's size.
func localPart(m *Manifest, trusted bool) (local []File, need, all int64) {
	for _, f := range m.Files {
		all += f.Size
		if path.Dir(f.Path) == criuimg.MemDir || !pulled(f.Path, trusted) {
			continue
		}
		local = append(local, f)
		need += f.Size
	}
	return local, need, all
}
