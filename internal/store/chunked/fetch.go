package chunked

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store"
)

// verifyBlock is how much of a chunk is hashed at a time: each block is read by its check and
// by the caller's digest while it is still in the core's cache, not twice from memory.
const verifyBlock = 64 << 10

// fetchChunk downloads chunk c of file (at offset off, for errors) and returns its bytes as
// parts, in order, only once they are checked against c (checkChunk): a missing, short, long
// or altered chunk is a *ChunkError. A chunk stored raw (rawFrame, most of GPU memory) is
// used where it arrived, its blocks in comp, not copied out; a compressed one is decoded into
// dst[:0], whose capacity should be c.Size. comp is the buffer for the bytes as stored; it is
// returned, with how many came over the wire. also, when not nil, is given the chunk's bytes
// as they are checked (the image's own digest of them).
func fetchChunk(ctx context.Context, st store.Store, prefix string, dec *zstd.Decoder, file string, off int64, c Chunk, dst, comp []byte, also *image.PieceHash) ([][]byte, []byte, error) {
	// A download that stalled is tried once more, from its start, as an upload is by the
	// S3 client: the digests of an attempt are taken afresh each time.
	for try := 1; ; try++ {
		parts, out, err := fetchOnce(ctx, st, prefix, dec, file, off, c, dst, comp, also)
		if try >= stalledTries || !errors.Is(err, store.ErrStalled) || ctx.Err() != nil {
			return parts, out, err
		}
		comp = out
	}
}

// stalledTries is how many times fetchChunk tries a chunk whose download stalls.
const stalledTries = 2

// fetchOnce is one attempt of fetchChunk.
func fetchOnce(ctx context.Context, st store.Store, prefix string, dec *zstd.Decoder, file string, off int64, c Chunk, dst, comp []byte, also *image.PieceHash) ([][]byte, []byte, error) {
	key := ChunkKey(prefix, c.SHA256)
	bad := func(reason string) error {
		return &ChunkError{URL: st.URL(key), File: file, Offset: off, Reason: reason}
	}
	r, err := st.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, comp, bad("missing")
	}
	if err != nil {
		return nil, comp, fmt.Errorf("fetch %s at %d: %w", file, off, err)
	}
	// A chunk stored raw is hashed as it arrives (rawContent), unless a piece of the image
	// must be hashed with it: a guess that turns out wrong could not be taken back from it.
	var guess *rawContent
	var h hash.Hash
	var arrived func([]byte)
	if also == nil {
		h = chunkHash(c)
		guess = &rawContent{size: c.Size, add: func(b []byte) { h.Write(b) }}
		arrived = guess.feed
	}
	comp, err = readAll(r, comp[:0], arrived)
	r.Close()
	if err != nil {
		return nil, comp, fmt.Errorf("fetch %s at %d: %w", file, off, err)
	}
	if len(comp) > maxStored {
		return nil, comp, bad(fmt.Sprintf("corrupted: object larger than %d bytes", maxStored))
	}
	parts, ok := rawBlocks(comp, c.Size)
	if ok && guess != nil && isRawFrame(comp, parts, c.Size) {
		if hex.EncodeToString(h.Sum(nil)) != chunkDigest(c) {
			return nil, comp, bad("corrupted: its bytes do not match the manifest object's digest")
		}
		return parts, comp, nil
	}
	if !ok {
		data, err := dec.DecodeAll(comp, dst[:0])
		if err != nil {
			return nil, comp, bad("corrupted: " + err.Error())
		}
		if int64(len(data)) != c.Size {
			return nil, comp, bad(fmt.Sprintf("corrupted: %d bytes, want %d", len(data), c.Size))
		}
		parts = [][]byte{data}
	}
	if !checkChunk(parts, c, also) {
		return nil, comp, bad("corrupted: its bytes do not match the manifest object's digest")
	}
	return parts, comp, nil
}

// newDecoder is the zstd decoder of fetchChunk for n chunks at once. The frame's own
// checksum is not checked: fetchChunk checks the decoded bytes (checkChunk), which says more.
func newDecoder(n int) (*zstd.Decoder, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(n), zstd.WithDecoderMaxMemory(2*ChunkSize), zstd.IgnoreChecksum(true))
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	return dec, nil
}

// checkChunk says whether a chunk's bytes (parts, in order) match its xxh64, or its sha256
// where the manifest object has no xxh64, and passes them to also (when not nil) block by
// block, while they are in cache.
func checkChunk(parts [][]byte, c Chunk, also *image.PieceHash) bool {
	h := chunkHash(c)
	for _, b := range parts {
		for len(b) > 0 {
			n := min(len(b), verifyBlock)
			h.Write(b[:n])
			if also != nil {
				also.Add(b[:n])
			}
			b = b[n:]
		}
	}
	return hex.EncodeToString(h.Sum(nil)) == chunkDigest(c)
}

// chunkHash is the hash a chunk is checked by: its xxh64, or its sha256 where the manifest
// object has no xxh64 (chunkDigest).
func chunkHash(c Chunk) hash.Hash {
	if c.XXH64 == "" {
		return sha256.New()
	}
	return xxhash.New()
}

// chunkDigest is the digest chunkHash must give.
func chunkDigest(c Chunk) string {
	if c.XXH64 == "" {
		return c.SHA256
	}
	return c.XXH64
}
