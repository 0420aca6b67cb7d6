package signing

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// A host's signing policy. An image is code: a restore runs its processes with the
// credentials the image lists, root's included, so an image that passed through hands
// others control (a shared store, another user's directory) runs as whoever it says. A host
// that restores such images keeps, where only root can change them, the public keys every
// image must be signed by, and the private key its own checkpoints are signed with.
const (
	// HostTrustDir holds the *.pub keys that every restore, pull, fold and verify on this
	// host asks an image to be signed by, where the command names no --trust of its own.
	HostTrustDir = "/etc/gpucr/trusted-keys"
	// HostKey is the private key this host's checkpoints are signed with when the command
	// names no --sign of its own.
	HostKey = "/etc/gpucr/signing-key"
)

// HostTrusted reads the keys of a host's policy from dir: nil where dir does not exist (no
// policy). A policy others than root could change is refused, not ignored (LoadTrusted, run
// by root): a key added by a user would let them sign images that root restores.
func HostTrusted(dir string) (Keys, error) {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	keys, err := LoadTrusted([]string{dir})
	if err != nil {
		return nil, fmt.Errorf("this host's trusted keys: %w", err)
	}
	return keys, nil
}

// HostSigningKey reads the private key at path that a host's checkpoints are signed with:
// nil where there is none.
func HostSigningKey(path string) (ed25519.PrivateKey, error) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	key, err := LoadPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("this host's signing key: %w", err)
	}
	return key, nil
}
