package chunked

import (
	"encoding/binary"
	"hash/crc32"

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
// it shrink by at least 1/32, else stored raw. It returns the frame's CRC32C too, for a
// store that sends one with each object: taken as each part of the frame is written, it
// costs no other read of the frame from memory.
func compress(enc *zstd.Encoder, data, dst []byte) ([]byte, uint32) {
	scratch := dst[len(dst):] // not over what dst holds
	if len(data) < 4*sampleSize || shrinks(enc, data[:sampleSize], scratch) || shrinks(enc, data[len(data)/2:][:sampleSize], scratch) {
		out := enc.EncodeAll(data, dst)
		return out, crc32.Checksum(out[len(dst):], castagnoli)
	}
	return rawFrame(data, dst)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

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

// rawHeader is where rawFrame's first block starts; each block then takes rawStride bytes of
// the frame (its 3-byte header and maxRawBlock bytes of content), the last fewer.
const (
	rawHeader = 4 + 1 + 4 // magic, descriptor, content size
	rawStride = 3 + maxRawBlock
)

// rawFrame appends to dst data (at most 4 GiB - 1 bytes) as one zstd frame of raw blocks,
// and returns the frame's CRC32C, taken of each block as soon as it is copied.
func rawFrame(data, dst []byte) ([]byte, uint32) {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, frameMagic)
	dst = append(dst, frameSingleSegment4)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(data)))
	sum := crc32.Update(0, castagnoli, dst[start:])
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), maxRawBlock)
		last := 0
		if n == len(data) {
			last = 1
		}
		h := uint32(n)<<3 | blockRaw<<1 | uint32(last)
		at := len(dst)
		dst = append(dst, byte(h), byte(h>>8), byte(h>>16))
		dst, data = append(dst, data[:n]...), data[n:]
		sum = crc32.Update(sum, castagnoli, dst[at:])
	}
	return dst, sum
}

// rawBlocks returns the blocks of frame, in order, if it is a frame as rawFrame writes them
// holding size bytes: one segment, a 4-byte content size, raw blocks only and nothing after
// the last. Their bytes are the content, so a fetched chunk is used without decoding, which
// would copy every byte once more. Any other frame, valid or not, is the decoder's to read.
func rawBlocks(frame []byte, size int64) ([][]byte, bool) {
	const header = rawHeader
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

// rawContent hashes, as a chunk's frame arrives read by read, the bytes that are its content
// if the frame is the one rawFrame writes of size bytes, whose blocks lie where they are known
// to before it arrives: each new byte is hashed while it is still in the core's cache, not
// read back from memory afterwards. Whether the frame is that one is known only once it is
// whole (isRawFrame); until then the hash is a guess, to be used only if it was right.
type rawContent struct {
	size int64
	at   int // bytes of the frame looked at
	add  func([]byte)
}

// feed adds the content among the bytes of frame (all that arrived so far) not yet looked at.
func (r *rawContent) feed(frame []byte) {
	last := int(max(0, r.size-1) / maxRawBlock) // the last block's index
	for r.at < len(frame) {
		if r.at < rawHeader {
			r.at = min(len(frame), rawHeader)
			continue
		}
		k := (r.at - rawHeader) / rawStride
		if k > last {
			r.at = len(frame) // past the content: not that frame, or nothing left
			return
		}
		start := rawHeader + k*rawStride + 3
		end := start + int(min(maxRawBlock, r.size-int64(k)*maxRawBlock))
		if r.at < start {
			r.at = min(len(frame), start)
			continue
		}
		if n := min(len(frame), end); n > r.at {
			r.add(frame[r.at:n])
			r.at = n
		}
		if r.at >= end {
			r.at = rawHeader + (k+1)*rawStride
		}
	}
}

// isRawFrame says whether parts, the blocks rawBlocks found in frame, are exactly where
// rawFrame puts the blocks of size bytes: then rawContent hashed them, and nothing else.
func isRawFrame(frame []byte, parts [][]byte, size int64) bool {
	if len(parts) != int(max(0, size-1)/maxRawBlock)+1 {
		return false
	}
	for k, p := range parts {
		at := cap(frame) - cap(p) // p lies in frame: its offset there
		if at != rawHeader+k*rawStride+3 || int64(len(p)) != min(maxRawBlock, size-int64(k)*maxRawBlock) {
			return false
		}
	}
	return true
}
