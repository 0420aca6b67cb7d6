package image

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Piece is the digests of one HashChunkSize piece of an image file. The xxh64 finds damage
// and is always there. The SHA-256 is there in a signed image's pieces: a signature vouches
// for the manifest's bytes, and only a cryptographic digest of each file in them makes it
// vouch for the files too (an xxh64 can be forged by anyone who can write the file).
type Piece struct {
	XXH64  uint64
	SHA256 [sha256.Size]byte
}

// PieceHash hashes one piece as its bytes pass: xxh64 always, SHA-256 when strong.
type PieceHash struct {
	x *xxhash.Digest
	s hash.Hash
}

// NewPieceHash starts the digests of an empty piece; strong adds its SHA-256.
func NewPieceHash(strong bool) *PieceHash {
	h := &PieceHash{x: xxhash.New()}
	if strong {
		h.s = sha256.New()
	}
	return h
}

// Add adds the piece's next bytes.
func (h *PieceHash) Add(p []byte) {
	_, _ = h.x.Write(p) // hashes never fail
	if h.s != nil {
		_, _ = h.s.Write(p)
	}
}

// Sum is the digests of the bytes written since the start or the last Reset.
func (h *PieceHash) Sum() Piece {
	p := Piece{XXH64: h.x.Sum64()}
	if h.s != nil {
		h.s.Sum(p.SHA256[:0])
	}
	return p
}

// Reset starts the next piece.
func (h *PieceHash) Reset() {
	h.x.Reset()
	if h.s != nil {
		h.s.Reset()
	}
}

// SumPiece is the digests of the whole piece b.
func SumPiece(b []byte, strong bool) Piece {
	p := Piece{XXH64: xxhash.Sum64(b)}
	if strong {
		p.SHA256 = sha256.Sum256(b)
	}
	return p
}

// FileOf is the manifest entry of the file at path, of size bytes, whose pieces in order
// have the digests pieces; strong records its SHA-256 too (the pieces must have theirs).
func FileOf(path string, size int64, pieces []Piece, strong bool) File {
	f := File{Path: path, Size: size, XXH64: piecesXXH64(pieces)}
	if strong {
		f.SHA256 = piecesSHA256(pieces)
	}
	return f
}

// Strong says whether f records its SHA-256: every check of it then checks that too.
func (f File) Strong() bool { return f.SHA256 != "" }

// Check returns a *CorruptError unless pieces, the digests of the file's pieces in order,
// make f's checksums: its xxh64, and its SHA-256 when it records one.
func (f File) Check(pieces []Piece) error {
	return f.same(FileOf(f.Path, f.Size, pieces, f.Strong()))
}

// piecesXXH64 is a file's checksum as a manifest writes it: the xxh64 of its pieces' xxh64
// digests in order, so that the pieces of one large file are hashed on all cores at once.
func piecesXXH64(pieces []Piece) string {
	h := xxhash.New()
	var b [8]byte
	for _, p := range pieces {
		binary.LittleEndian.PutUint64(b[:], p.XXH64)
		h.Write(b[:])
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// piecesSHA256 is a file's SHA-256 as a manifest writes it: the SHA-256 of its pieces'
// SHA-256 digests in order, for the same reason.
func piecesSHA256(pieces []Piece) string {
	h := sha256.New()
	for _, p := range pieces {
		h.Write(p.SHA256[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// FileReads collects the digests of a file's pieces as a reader hashes them, one whole
// piece at a time, in any order and from any goroutine as long as each piece is recorded
// by one, so that the file is checked against its manifest entry once every piece is in:
// a restore verifies what it reads as it reads it, not in a second pass.
type FileReads struct {
	File   File
	pieces []Piece
	read   []bool
}

// NewFileReads starts collecting the pieces of f.
func NewFileReads(f File) *FileReads {
	n := (f.Size + HashChunkSize - 1) / HashChunkSize
	return &FileReads{File: f, pieces: make([]Piece, n), read: make([]bool, n)}
}

// Piece says which piece a read of n bytes from off is, if it is one whole piece.
func (r *FileReads) Piece(off, n int64) (int, bool) {
	if off < 0 || off%HashChunkSize != 0 || off >= r.File.Size || n != min(HashChunkSize, r.File.Size-off) {
		return 0, false
	}
	return int(off / HashChunkSize), true
}

// Record keeps the digests of piece k.
func (r *FileReads) Record(k int, d Piece) { r.pieces[k], r.read[k] = d, true }

// Whole says whether every piece was recorded.
func (r *FileReads) Whole() bool { return !slices.Contains(r.read, false) }

// Check returns a *CorruptError unless every piece was recorded and together they are the
// file's manifest entry.
func (r *FileReads) Check() error {
	if !r.Whole() {
		return &CorruptError{Path: r.File.Path, Reason: "not read whole"}
	}
	return r.File.Check(r.pieces)
}

// IsXXH64 says whether s is an xxh64 digest as gpucr writes them: 16 lowercase hex digits.
func IsXXH64(s string) bool { return isHex(s, 8) }

// IsSHA256 says whether s is a SHA-256 digest as gpucr writes them: 64 lowercase hex digits.
func IsSHA256(s string) bool { return isHex(s, sha256.Size) }

// isHex says whether s is n bytes in lowercase hex.
func isHex(s string, n int) bool {
	return len(s) == 2*n && strings.Trim(s, "0123456789abcdef") == ""
}
