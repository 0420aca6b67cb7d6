package engine

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/pageserver"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// A page file the sink cannot create is no file at all: a nil pointer in the Receiver
// interface is not nil, and the page server closed it when CRIU's connection failed, a
// panic that killed gpucr in the middle of a streamed checkpoint whose store had failed.
func TestSinkThatCannotCreateReturnsNoFile(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stream, err := chunked.NewStream(ctx, store.NewDir(t.TempDir()), "ckpt", chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Abort()
	cancel(errors.New("a chunk upload failed"))

	stage, err := image.Begin(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stage.Abort(); err != nil {
			t.Error(err)
		}
	})
	staged := stagingSink{stage}
	first, err := staged.Create("pages-1.img")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	for name, c := range map[string]struct {
		sink pageserver.Sink
		file string
	}{
		"store whose upload failed": {StoreSink(stream), "pages-1.img"},
		"staged file that exists":   {staged, "pages-1.img"},
	} {
		t.Run(name, func(t *testing.T) {
			r, err := c.sink.Create(c.file)
			if err == nil || r != nil {
				t.Fatalf("Create = %#v, %v; want no file and the error", r, err)
			}
		})
	}
}
