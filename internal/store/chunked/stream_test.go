package chunked_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// A streamed page file is cut where its pages' addresses cross a 4 MiB window, like a
// pushed one; the sealed image it finishes pulls back whole and verified.
func TestStreamCutsByAddressAndPullsBack(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			// Signed: the streamed file must come with its SHA-256, which only a Summer
			// that saw its bytes can give.
			pub, key, err := ed25519.GenerateKey(nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := chunked.NewStream(ctx, st, "jobs/ckpt-1", chunked.Options{Signed: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Abort()
			f, err := s.Create("criu/pages-65537.img")
			if err != nil {
				t.Fatal(err)
			}
			const page = 4096
			runs := []struct {
				vaddr uint64
				data  []byte
			}{
				{0x3ff000, random(1, 3*page)},     // crosses into the second window
				{0x500000, random(2, 1024*page)},  // fills the second window, spills into the third
				{0x10000000, make([]byte, 8*mib)}, // two windows of zeros
			}
			var all []byte
			for _, r := range runs {
				if err := f.Receive(r.vaddr, len(r.data), bytes.NewReader(r.data)); err != nil {
					t.Fatal(err)
				}
				all = append(all, r.data...)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			streamed, err := s.Files()
			if err != nil {
				t.Fatal(err)
			}

			stage, err := image.Begin(filepath.Join(t.TempDir(), "img"))
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := stage.Abort(); err != nil {
					t.Error(err)
				}
			}()
			stage.SignWith = key
			if err := os.WriteFile(filepath.Join(stage.CRIUDir(), "pagemap-42.img"), []byte("pagemap"), 0o600); err != nil {
				t.Fatal(err)
			}
			m := &image.Manifest{GpucrVersion: "test", Created: time.Now().UTC(), RootPID: 42, Processes: []image.Process{{PID: 42}}}
			if err := stage.Seal(m, streamed); err != nil {
				t.Fatal(err)
			}
			om, stats, err := s.Finish(ctx, stage.Dir(), m)
			if err != nil {
				t.Fatal(err)
			}
			var sizes []int64
			var zero []bool
			for _, file := range om.Files {
				if file.Path == "criu/pages-65537.img" {
					for _, c := range file.Chunks {
						sizes = append(sizes, c.Size/page)
						zero = append(zero, c.Zero)
					}
				}
			}
			if want := []int64{1, 770, 256, 1024, 1024}; !slices.Equal(sizes, want) || !zero[3] || !zero[4] || zero[0] {
				t.Errorf("chunks of the streamed pages file: %v pages (zero %v), want %v", sizes, zero, want)
			}
			if stats.ZeroBytes != 8*mib || stats.Bytes < int64(len(all)) {
				t.Errorf("stats %+v", stats)
			}

			dst := filepath.Join(t.TempDir(), "pulled")
			trusted := chunked.Options{Trust: signing.Keys{signing.ID(pub): pub}}
			if pm, _, err := chunked.Pull(ctx, st, "jobs/ckpt-1", dst, trusted); err != nil || !pm.Digested() {
				t.Fatalf("trusted pull of the signed stream: %v", err)
			}
			got, err := os.ReadFile(filepath.Join(dst, "criu/pages-65537.img"))
			if err != nil || !bytes.Equal(got, all) {
				t.Fatalf("pulled pages file: %d bytes, want %d (%v)", len(got), len(all), err)
			}
		})
	}
}
