package chunked

import (
	"encoding/binary"

	"github.com/klauspost/compress/zstd"
)

// GPU memory is mostly incompressible (weights, activations, optimizer state): zstd spends
// ~1.4 ms per MiB of one core learning that, more than hashing and sending the chunk
// together. compress tries a sample first and stores a chunk whose sample does not shrink
// as a zstd frame of raw blocks, which every zstd decoder reads: the store's format and a
// chunk's key stay what they are, and a chunk stored either way dedups with the other.

// sampleSize is how much of a chunk, at its start and at its middle, is compressed to
// decide whether the rest is worth it.
const sampleSize = 32 << 10

// compress appends to dst the chunk data as a zstd frame: compressed by enc if samples of
// it shrink by at least 1/32, else stored raw.
func compress(enc *zstd.Encoder, data, dst []byte) []byte {
	if len(data) < 4*sampleSize || shrinks(enc, data[:sampleSize], dst) || shrinks(enc, data[len(data)/2:][:sampleSize], dst) {
		return enc.EncodeAll(data, dst)
	}
	return rawFrame(data, dst)
}

// shrinks says whether enc makes sample at least 1/32 smaller; scratch is spare capacity.
func shrinks(enc *zstd.Encoder, sample, scratch []byte) bool {
	return len(enc.EncodeAll(sample, scratch[:0])) < len(sample)-len(sample)/32
}

// Frame layout, RFC 8878 section 3.1.1.
const (
	frameMagic = 0xFD2FB528
	// frameSingleSegment4 is a frame header descriptor: one segment (the window is the
	// content, so no window descriptor), a 4-byte content size, no checksum, no dictionary.
	frameSingleSegment4 = 2<<6 | 1<<5
	maxRawBlock         = 128 << 10 // the largest block any frame may hold
	blockRaw            = 0         // Block_Type of a block stored as is
)

// rawFrame appends to dst data (at most 4 GiB - 1 bytes) as one zstd frame of raw blocks.
func rawFrame(data, dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, frameMagic)
	dst = append(dst, frameSingleSegment4)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(data)))
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), maxRawBlock)
		last := 0
		if n == len(data) {
			last = 1
		}
		h := uint32(n)<<3 | blockRaw<<1 | uint32(last)
		dst = append(dst, byte(h), byte(h>>8), byte(h>>16))
		dst, data = append(dst, data[:n]...), data[n:]
	}
	return dst
}

// rawBlocks returns the blocks of frame, in order, if it is a frame as rawFrame writes them
// holding size bytes: one segment, a 4-byte content size, raw blocks only and nothing after
// the last. Their bytes are the content, so a fetched chunk is used without decoding, which
// would copy every byte once more. Any other frame, valid or not, is the decoder's to read.
func rawBlocks(frame []byte, size int64) ([][]byte, bool) {
	const header = 4 + 1 + 4 // magic, descriptor, content size
	if len(frame) < header || binary.LittleEndian.Uint32(frame) != frameMagic || frame[4] != frameSingleSegment4 ||
		int64(binary.LittleEndian.Uint32(frame[5:])) != size {
		return nil, false
	}
	parts := make([][]byte, 0, size/maxRawBlock+1)
	var got int64
	for rest, last := frame[header:], false; !last; {
		if len(rest) < 3 {
			return nil, false
		}
		h := uint32(rest[0]) | uint32(rest[1])<<8 | uint32(rest[2])<<16
		n := int(h >> 3)
		if (h>>1)&3 != blockRaw || n > maxRawBlock || n > len(rest)-3 {
			return nil, false
		}
		last = h&1 == 1
		if n > 0 {
			parts = append(parts, rest[3:3+n])
		}
		got += int64(n)
		rest = rest[3+n:]
		if last && len(rest) != 0 {
			return nil, false
		}
	}
	return parts, got == size
}
