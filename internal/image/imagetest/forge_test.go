package imagetest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The forgery the trust tests rely on changes the bytes and keeps the xxh64.
func TestForgeXXH64KeepsTheDigest(t *testing.T) {
	b := make([]byte, 8<<20+13)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	orig, want := bytes.Clone(b), xxhash.Sum64(b)
	ForgeXXH64(b, 1000, 0x41)
	if xxhash.Sum64(b) != want || bytes.Equal(orig[:32000], b[:32000]) || !bytes.Equal(orig[32032:], b[32032:]) {
		t.Fatal("the forgery changed the digest, or not the bytes it says")
	}
}
