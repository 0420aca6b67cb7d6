package imagetest

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// xxh64's primes (seed 0), as the algorithm's specification gives them.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
)

// ForgeXXH64 changes piece in place, as someone who can write an image would, so that its
// bytes from 0 to 32*stripe differ from what they were and its xxh64 stays the same: the
// bytes before are filled with fill, the 32 bytes at stripe are chosen to bring xxh64's
// four accumulators back to the values the original bytes gave them, and the rest is left.
// It proves the xxh64 of an image's pieces is no defence against tampering. piece must
// hold at least 32*(stripe+1) bytes, and stripe must be at least 1.
func ForgeXXH64(piece []byte, stripe int, fill byte) {
	if stripe < 1 || len(piece) < 32*(stripe+1) {
		panic("ForgeXXH64: no room for the stripe")
	}
	want := xxhash.Sum64(piece)
	target := accumulators(piece[:32*(stripe+1)])
	for i := range 32 * stripe {
		piece[i] = fill
	}
	acc := accumulators(piece[:32*stripe])
	p1, p2 := inverse(prime1), inverse(prime2)
	for k := range 4 {
		// round(acc, lane) = rotl(acc + lane*prime2, 31) * prime1, solved for lane.
		lane := (bits.RotateLeft64(target[k]*p1, -31) - acc[k]) * p2
		binary.LittleEndian.PutUint64(piece[32*stripe+8*k:], lane)
	}
	if xxhash.Sum64(piece) != want {
		panic("ForgeXXH64: the forgery does not keep the digest")
	}
}

// accumulators are xxh64's four accumulators after the whole 32-byte stripes of b.
func accumulators(b []byte) [4]uint64 {
	seed, p1, p2 := uint64(0), prime1, prime2 // variables: the sums wrap, as the algorithm means
	acc := [4]uint64{seed + p1 + p2, seed + p2, seed, seed - p1}
	for ; len(b) >= 32; b = b[32:] {
		for k := range acc {
			lane := binary.LittleEndian.Uint64(b[8*k:])
			acc[k] = bits.RotateLeft64(acc[k]+lane*p2, 31) * p1
		}
	}
	return acc
}

// inverse is the multiplicative inverse of the odd a modulo 2^64 (Newton's iteration,
// each step doubling the correct low bits).
func inverse(a uint64) uint64 {
	x := a
	for range 6 {
		x *= 2 - a*x
	}
	return x
}
