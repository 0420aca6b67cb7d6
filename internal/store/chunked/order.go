package chunked

import (
	"cmp"
	"path"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// restoreOrder compares two files of the image im describes by when a restore needs them,
// which is the order a checkpoint's manifest lists its files and so the order a pull or a
// streamed restore fetches them: gpucr's manifest and what seals it, the files CRIU parses,
// CRIU's page files, then the memory gpucr saved in the order its fill reads it (the
// image manifest's), and last CRIU's logs, which no restore reads.
func restoreOrder(im *image.Manifest) func(a, b string) int {
	fill := map[string]int{}
	for i, f := range im.Files {
		fill[f.Path] = i
	}
	rank := func(p string) int {
		switch {
		case p == image.ManifestName:
			return 0
		case p == image.SealName:
			return 1
		case p == image.SigName:
			return 2
		case path.Dir(p) == criuimg.MemDir:
			return 5
		case path.Dir(p) == image.LogsDir:
			return 6
		case criuimg.IsPagesName(path.Base(p)):
			return 4
		}
		return 3
	}
	return func(a, b string) int {
		ra, rb := rank(a), rank(b)
		if ra == 5 && rb == 5 {
			if c := cmp.Compare(fill[a], fill[b]); c != 0 {
				return c
			}
		}
		return cmp.Or(cmp.Compare(ra, rb), cmp.Compare(a, b))
	}
}
