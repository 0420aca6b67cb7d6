package signing

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/rootonly"
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
// policy). A policy others than root could change is refused, not ignored: a key added by a
// user would let them sign images that root restores.
func HostTrusted(dir string) (Keys, error) {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("this host's trusted keys: %w", err)
	}
	if err := rootOnly(dir, fi); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"+PublicSuffix))
	if err != nil {
		return nil, fmt.Errorf("this host's trusted keys: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("this host's trusted keys: no *%s file in %s (add the keys images must be signed by, or remove the directory)", PublicSuffix, dir)
	}
	keys := Keys{}
	for _, f := range files {
		fi, err := os.Lstat(f)
		if err != nil {
			return nil, fmt.Errorf("this host's trusted keys: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("this host's trusted key %s is not a regular file", f)
		}
		if err := rootonly.Mode(f, fi); err != nil {
			return nil, fmt.Errorf("this host's trusted keys: %w", err)
		}
		pub, err := LoadPublic(f)
		if err != nil {
			return nil, err
		}
		keys[ID(pub)] = pub
	}
	return keys, nil
}

// HostSigningKey reads the private key at path that a host's checkpoints are signed with:
// nil where there is none.
func HostSigningKey(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("this host's signing key: %w", err)
	}
	if err := rootOnly(path, fi); err != nil {
		return nil, err
	}
	return LoadPrivate(path)
}

// rootOnly refuses a policy file or directory at path (fi, not followed) that others than
// root could change, or that lies where they could swap it.
func rootOnly(path string, fi fs.FileInfo) error {
	var err error
	if fi.Mode()&fs.ModeSymlink != 0 {
		err = fmt.Errorf("%s is a symlink", path)
	} else if err = rootonly.Mode(path, fi); err == nil {
		err = rootonly.Walk(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("this host's signing policy could be changed by others than root: %w", err)
	}
	return nil
}
