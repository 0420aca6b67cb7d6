package chunked

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/store"
)

// Frames of raw blocks are read back by the decoder every restore uses, at every size
// around a block's limit, and come with their own CRC32C (not that of what dst held).
func TestRawFramesDecode(t *testing.T) {
	dec, err := newDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	random := randomBytes(ChunkSize)
	for _, n := range []int{0, 1, 5, maxRawBlock - 1, maxRawBlock, maxRawBlock + 1, 3 * maxRawBlock, ChunkSize} {
		out, sum := rawFrame(random[:n], []byte("before"))
		frame := out[len("before"):]
		if want := 9 + 3*max(1, (n+maxRawBlock-1)/maxRawBlock) + n; len(frame) != want {
			t.Errorf("%d bytes: frame of %d bytes, want %d", n, len(frame), want)
		}
		if want := crc32.Checksum(frame, castagnoli); sum != want {
			t.Errorf("%d bytes: CRC32C %08x, the frame's is %08x", n, sum, want)
		}
		got, err := dec.DecodeAll(frame, nil)
		if err != nil || !bytes.Equal(got, random[:n]) {
			t.Errorf("%d bytes: decoded %d bytes, %v", n, len(got), err)
		}
	}
}

// Incompressible chunks are stored raw, compressible ones compressed; both read back.
func TestCompressStoresIncompressibleChunksRaw(t *testing.T) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	dec, err := newDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	random := randomBytes(ChunkSize)
	text := bytes.Repeat([]byte("weights 0.125 0.25 0.5 "), ChunkSize/23)
	// Random at the start and the middle, but text elsewhere: compressed only if a sample
	// says so; here neither does, so it is stored raw and still reads back.
	mixed := append(append(append([]byte{}, random[:ChunkSize/4]...), text[:ChunkSize/4]...), random[:ChunkSize/2]...)
	halfText := append(append([]byte{}, text[:ChunkSize/2]...), random[:ChunkSize/2]...)
	for _, c := range []struct {
		name string
		data []byte
		raw  bool
	}{{"random", random, true}, {"text", text, false}, {"random where sampled", mixed, true}, {"text at the start", halfText, false}, {"small", random[:1000], false}} {
		// dst with room to spare: the samples' trial compressions must not write over it.
		out, sum := compress(enc, c.data, append(make([]byte, 0, 2*ChunkSize), "before"...))
		if string(out[:len("before")]) != "before" {
			t.Errorf("%s: what dst held became %q", c.name, out[:len("before")])
		}
		frame := out[len("before"):]
		if isRaw := len(frame) == len(raw(c.data)); isRaw != c.raw {
			t.Errorf("%s: %d bytes stored as %d, raw %v, want %v", c.name, len(c.data), len(frame), isRaw, c.raw)
		}
		if want := crc32.Checksum(frame, castagnoli); sum != want {
			t.Errorf("%s: CRC32C %08x, the frame's is %08x", c.name, sum, want)
		}
		got, err := dec.DecodeAll(frame, nil)
		if err != nil || !bytes.Equal(got, c.data) {
			t.Errorf("%s: decoded %d bytes, %v", c.name, len(got), err)
		}
	}
}

// raw is data's frame of raw blocks.
func raw(data []byte) []byte {
	frame, _ := rawFrame(data, nil)
	return frame
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// A raw frame's blocks are its content without decoding, at every size around a block's
// limit; anything else, or a frame of another size, is left to the decoder.
func TestRawBlocks(t *testing.T) {
	random := randomBytes(ChunkSize)
	for _, n := range []int{1, 5, maxRawBlock - 1, maxRawBlock, maxRawBlock + 1, 3 * maxRawBlock, ChunkSize} {
		frame := raw(random[:n])
		parts, ok := rawBlocks(frame, int64(n))
		if !ok || !bytes.Equal(bytes.Join(parts, nil), random[:n]) {
			t.Errorf("%d bytes: %d parts, ok %v, not the content", n, len(parts), ok)
		}
		if _, ok := rawBlocks(frame, int64(n)+1); ok {
			t.Errorf("%d bytes: read as %d", n, n+1)
		}
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	frame := raw(random[:3*maxRawBlock])
	for name, f := range map[string][]byte{
		"compressed":        enc.EncodeAll(bytes.Repeat([]byte("gpucr "), 1000), nil),
		"trailing bytes":    append(bytes.Clone(frame), 0),
		"truncated":         frame[:len(frame)-1],
		"no last block":     frame[:9+3+maxRawBlock],
		"another magic":     append([]byte{0x29}, frame[1:]...),
		"another header":    append(append(bytes.Clone(frame[:4]), frameSingleSegment4|1<<2), frame[5:]...),
		"header only":       frame[:9],
		"a compressed type": append(bytes.Clone(frame[:9]), byte(2<<1|1), 0, 0),
	} {
		if parts, ok := rawBlocks(f, 3*maxRawBlock); ok {
			t.Errorf("%s: read as %d raw blocks", name, len(parts))
		}
	}
}

// Whatever rawBlocks reads as a raw frame, the decoder reads as the same bytes: using the
// blocks where they lie changes nothing a restore gets.
func FuzzRawBlocks(f *testing.F) {
	f.Add(raw(randomBytes(maxRawBlock+3)), int64(maxRawBlock+3))
	f.Add(raw([]byte("gpucr")), int64(5))
	dec, err := newDecoder(1)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, frame []byte, size int64) {
		parts, ok := rawBlocks(frame, size)
		if !ok {
			return
		}
		got, err := dec.DecodeAll(frame, nil)
		if err != nil || !bytes.Equal(bytes.Join(parts, nil), got) || int64(len(got)) != size {
			t.Fatalf("raw blocks of %d bytes, the decoder: %d bytes, %v", size, len(got), err)
		}
		// What rawContent hashed as the frame arrived is the content, whenever it is used.
		if hashed := feedInPieces(frame, size, len(frame)/3, len(frame)/2); isRawFrame(frame, parts, size) && !bytes.Equal(hashed, got) {
			t.Fatalf("raw frame of %d bytes: rawContent took %d other bytes", size, len(hashed))
		}
	})
}

// feedInPieces is what rawContent takes of frame when it arrives cut at the offsets cuts.
func feedInPieces(frame []byte, size int64, cuts ...int) []byte {
	var took []byte
	r := &rawContent{size: size, add: func(b []byte) { took = append(took, b...) }}
	for _, c := range cuts {
		r.feed(frame[:min(c, len(frame))])
	}
	r.feed(frame)
	return took
}

// A raw frame is hashed as it arrives, read by read, wherever the reads end: the bytes it
// takes are the content, and only they.
func TestRawContentTakesTheContentAsItArrives(t *testing.T) {
	random := randomBytes(ChunkSize)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 5, maxRawBlock - 1, maxRawBlock, maxRawBlock + 1, 3 * maxRawBlock, ChunkSize} {
		frame := raw(random[:n])
		parts, ok := rawBlocks(frame, int64(n))
		if !ok || !isRawFrame(frame, parts, int64(n)) {
			t.Fatalf("%d bytes: rawFrame's frame is not read as one", n)
		}
		for range 20 {
			cuts := []int{rng.IntN(len(frame) + 1), rng.IntN(len(frame) + 1), rng.IntN(16), rawHeader + 2}
			slices.Sort(cuts)
			if took := feedInPieces(frame, int64(n), cuts...); !bytes.Equal(took, random[:n]) {
				t.Fatalf("%d bytes cut at %v: took %d bytes, not the content", n, cuts, len(took))
			}
		}
	}
}

// A frame of raw blocks that rawFrame would not write (an empty block first: valid zstd, the
// same content) moves every block: what was hashed as it arrived is not used, the chunk is
// checked again whole and is read right, or refused if a byte of it changed.
func TestFetchChecksFramesNotCutAsExpected(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	content := randomBytes(2*maxRawBlock + 7)
	sum := sha256.Sum256(content)
	c := Chunk{Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:]), XXH64: fmt.Sprintf("%016x", xxhash.Sum64(content))}
	frame := raw(content)
	shifted := append(append(bytes.Clone(frame[:rawHeader]), byte(blockRaw<<1), 0, 0), frame[rawHeader:]...)
	if parts, ok := rawBlocks(shifted, c.Size); !ok || isRawFrame(shifted, parts, c.Size) {
		t.Fatalf("the shifted frame must read as raw blocks, not where rawFrame puts them, for this test to mean anything")
	}
	dec, err := newDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	fetch := func(object []byte) ([]byte, error) {
		if err := st.Put(ctx, ChunkKey("ckpt", c.SHA256), object); err != nil {
			t.Fatal(err)
		}
		parts, _, err := fetchChunk(ctx, st, "ckpt", dec, "mem/1.img", 0, c, make([]byte, 0, c.Size), nil, nil)
		return bytes.Join(parts, nil), err
	}
	for name, object := range map[string][]byte{"as written": frame, "shifted": shifted} {
		if got, err := fetch(object); err != nil || !bytes.Equal(got, content) {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
		changed := bytes.Clone(object)
		changed[len(changed)-3] ^= 1
		if _, err := fetch(changed); !errors.Is(err, ErrBadChunk) {
			t.Errorf("%s with a byte changed: %v, want it refused", name, err)
		}
	}
}
