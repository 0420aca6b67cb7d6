// Package signing signs an image's manifest with an ed25519 key and checks a signature
// against the keys a user trusts. The manifest checksums every file of the image, so a
// signature over its bytes vouches for the whole image; the plain seal beside it only finds
// damage, since whoever can write an image can recompute it.
//
// Keys are PEM files in the formats OpenSSL writes (`openssl genpkey -algorithm ed25519`
// and `openssl pkey -pubout`): PKCS #8 for the private key, PKIX for the public one.
package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/gpucr/gpucr/internal/rootonly"
)

// ErrUntrusted is returned for an image whose signature is missing, made by a key not
// trusted, or does not match its manifest.
var ErrUntrusted = errors.New("image not trusted")

// Algorithm names the only signature scheme, first on a signature line.
const Algorithm = "ed25519"

// PublicSuffix is appended to a private key's path for its public half by Generate, and is
// what LoadTrusted reads from a directory.
const PublicSuffix = ".pub"

// ID names a public key in signatures and messages: the first 16 hex digits of the SHA-256
// of its raw 32 bytes.
func ID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Generate writes a new key pair: the private key at path (0600, never over an existing
// file) and the public key at path+PublicSuffix.
func Generate(path string) (ed25519.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode public key: %w", err)
	}
	if err := writeNew(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := writeNew(path+PublicSuffix, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		os.Remove(path)
		return nil, err
	}
	return pub, nil
}

// CheckNewKeyPath says, in one line a user can act on, why keygen could not create a key
// at path: it (or path.pub) exists, or its directory does not. Without it they learnt of it
// from the link of a temporary file ("link /tmp/.k.tmp-123 /tmp/k: file exists").
func CheckNewKeyPath(path string) error {
	for _, p := range []string{path, path + PublicSuffix} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s already exists: keygen never replaces a key; give a new PATH, or remove the old key first", p)
		}
	}
	dir := filepath.Dir(path)
	switch fi, err := os.Stat(dir); {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("directory %s does not exist: create it, or give a PATH in another", dir)
	case err == nil && !fi.IsDir():
		return fmt.Errorf("%s is not a directory: give a PATH in a directory", dir)
	}
	return nil
}

// writeNew writes b at path, which must not exist, whole or not at all: written aside,
// synced, then linked into place. Created in place, a key whose writing was cut short (a
// kill) stayed empty, and blocked keygen at its path and every sign with it (hostile test).
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write key %s: %w", path, bare(err))
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if keyFileMade != nil {
		keyFileMade()
	}
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, path) // fails where path exists: nothing is overwritten
	}
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists: keygen never replaces a key; give a new PATH, or remove the old key first", path)
	}
	if err != nil {
		return fmt.Errorf("write key %s: %w", path, bare(err))
	}
	return nil
}

// bare is err without the path of the temporary file it names, which is no file of the
// user's: "no space left on device", not "write /d/.k.tmp-123: no space left on device".
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// keyFileMade, when set, runs once a key's file is made, before a byte is in it: tests kill
// the process there.
var keyFileMade func()

// LoadPrivate reads an ed25519 private key. A key others can read is refused: it would let
// them sign images this host trusts.
func LoadPrivate(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if err := rootsOwn(path); err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	b, err := readKey(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if _, err := parsePEM(b, "PUBLIC KEY", x509.ParsePKIXPublicKey); err == nil {
		return nil, fmt.Errorf("signing key %s is a public key: sign with the private key (gpucr keygen PATH writes it to PATH, the public key to PATH%s)", path, PublicSuffix)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("signing key %s is readable by others (mode %04o): chmod 600 it", path, fi.Mode().Perm())
	}
	key, err := parsePEM(b, "PRIVATE KEY", x509.ParsePKCS8PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key %s is not an ed25519 key", path)
	}
	return priv, nil
}

// rootsOwn refuses, to gpucr running as root, a key at path that others than root could
// change or swap (the file, or a directory on the way to it): whoever could would have root
// sign with, or trust, a key of theirs.
func rootsOwn(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := rootonly.Walk(path); err != nil {
		return fmt.Errorf("%w: another user could swap in a key of theirs; keep keys where only root can change them", err)
	}
	return nil
}

// Keys are trusted public keys by ID. An empty set trusts nothing and asks for nothing.
type Keys map[string]ed25519.PublicKey

// LoadTrusted reads public keys from each path: a PEM file, or a directory whose *.pub
// files are read.
func LoadTrusted(paths []string) (Keys, error) {
	keys := Keys{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("trusted key: %w", err)
		}
		if err := rootsOwn(p); err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", p, err)
		}
		files := []string{p}
		if fi.IsDir() {
			if files, err = filepath.Glob(filepath.Join(p, "*"+PublicSuffix)); err != nil {
				return nil, fmt.Errorf("trusted keys in %s: %w", p, err)
			}
			if len(files) == 0 {
				return nil, fmt.Errorf("trusted keys: no *%s file in %s", PublicSuffix, p)
			}
		}
		for _, f := range files {
			if err := rootsOwn(f); err != nil {
				return nil, fmt.Errorf("trusted key %s: %w", f, err)
			}
			pub, err := LoadPublic(f)
			if err != nil {
				return nil, err
			}
			keys[ID(pub)] = pub
		}
	}
	return keys, nil
}

// LoadPublic reads one ed25519 public key.
func LoadPublic(path string) (ed25519.PublicKey, error) {
	b, err := readKey(path)
	if err != nil {
		return nil, fmt.Errorf("trusted key: %w", err)
	}
	key, err := parsePEM(b, "PUBLIC KEY", x509.ParsePKIXPublicKey)
	if err != nil {
		return nil, fmt.Errorf("trusted key %s: %w", path, err)
	}
	pub, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("trusted key %s is not an ed25519 key", path)
	}
	return pub, nil
}

// maxKeyFile is the most a key file may hold: an ed25519 key in PEM is about 120 bytes.
const maxKeyFile = 64 << 10

// readKey reads the key file at path, a regular file of at most maxKeyFile bytes, opened
// without blocking: a FIFO as a key (one *.pub of a trusted directory) hung verify, sign,
// pull and restore, and a key file of 3 GiB was read whole into memory (hostile test).
func readKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file", path)
	case fi.Size() > maxKeyFile:
		return nil, fmt.Errorf("%s holds %d bytes, more than a key's %d", path, fi.Size(), maxKeyFile)
	}
	return io.ReadAll(io.LimitReader(f, maxKeyFile+1))
}

func parsePEM(b []byte, typ string, parse func([]byte) (any, error)) (any, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != typ {
		return nil, fmt.Errorf("not a PEM %q block", typ)
	}
	return parse(block.Bytes)
}

// Sign returns the signature file for manifest: one line naming the scheme, the key and the
// signature.
func Sign(key ed25519.PrivateKey, manifest []byte) []byte {
	pub := key.Public().(ed25519.PublicKey)
	sig := ed25519.Sign(key, manifest)
	return []byte(fmt.Sprintf("%s %s %s\n", Algorithm, ID(pub), base64.StdEncoding.EncodeToString(sig)))
}

// Check verifies that sigFile holds a signature of manifest by one of k, and returns that
// key's ID. Lines naming other keys are skipped, so an image may carry several signatures,
// and so are lines that are no signature at all.
func (k Keys) Check(manifest, sigFile []byte) (string, error) {
	var signers []string
	lines, malformed := parseLines(sigFile)
	for _, l := range lines {
		signers = append(signers, l.id)
		pub, ok := k[l.id]
		if !ok {
			continue
		}
		if !ed25519.Verify(pub, manifest, l.sig) {
			return "", fmt.Errorf("%w: its signature by key %s does not match its manifest", ErrUntrusted, l.id)
		}
		return l.id, nil
	}
	switch {
	case len(signers) == 0 && malformed > 0:
		return "", fmt.Errorf("%w: its signature file holds no well-formed signature", ErrUntrusted)
	case len(signers) == 0:
		return "", fmt.Errorf("%w: it is not signed", ErrUntrusted)
	}
	sort.Strings(signers)
	return "", fmt.Errorf("%w: signed by key %s, which is not among the %d trusted", ErrUntrusted, strings.Join(signers, ", "), len(k))
}

// line is one signature of a signature file.
type line struct {
	id  string
	sig []byte
	raw string
}

// parseLine reads "ALGORITHM KEYID BASE64" with the one algorithm this format knows.
func parseLine(s string) (line, bool) {
	f := strings.Fields(s)
	if len(f) != 3 || f[0] != Algorithm {
		return line{}, false
	}
	sig, err := base64.StdEncoding.DecodeString(f[2])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return line{}, false
	}
	return line{id: f[1], sig: sig, raw: strings.Join(f, " ")}, true
}

// parseLines returns the well-formed signature lines of sigFile, in order, and how many
// other lines are not blank.
func parseLines(sigFile []byte) (lines []line, malformed int) {
	for _, s := range strings.Split(string(sigFile), "\n") {
		if l, ok := parseLine(s); ok {
			lines = append(lines, l)
		} else if strings.TrimSpace(s) != "" {
			malformed++
		}
	}
	return lines, malformed
}

// Others returns the well-formed signature lines of sigFile made by keys other than id,
// as a signature file of their own: what a new signature by id is added to.
func Others(sigFile []byte, id string) []byte {
	var out []byte
	lines, _ := parseLines(sigFile)
	for _, l := range lines {
		if l.id != id {
			out = append(append(out, l.raw...), '\n')
		}
	}
	return out
}

// IDs are the key IDs of the signature lines of sigFile.
func IDs(sigFile []byte) []string {
	var out []string
	lines, _ := parseLines(sigFile)
	for _, l := range lines {
		out = append(out, l.id)
	}
	return out
}
