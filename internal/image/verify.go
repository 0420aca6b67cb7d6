package image

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/signing"
)

// Errors a restore refuses an image for.
var (
	ErrNoManifest  = errors.New("not a gpucr image")
	ErrNewerFormat = errors.New("image format is newer than this gpucr")
	ErrCorrupt     = errors.New("image is corrupted")
)

// CorruptError names the file of an image that is wrong and how, so that a user knows
// which file to look at; errors.Is matches it to ErrCorrupt.
type CorruptError struct {
	Path, Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("image file %s: %s", e.Path, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true for every CorruptError.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// sentinelError is a sentence for users that errors.Is still matches to a sentinel,
// without the sentence having to repeat the sentinel's own text.
type sentinelError struct {
	msg      string
	sentinel error
}

func (e *sentinelError) Error() string { return e.msg }
func (e *sentinelError) Unwrap() error { return e.sentinel }

func sentinelf(sentinel error, format string, args ...any) error {
	return &sentinelError{msg: fmt.Sprintf(format, args...), sentinel: sentinel}
}

// Load reads and checks an image's manifest, not its files.
func Load(dir string) (*Manifest, error) {
	m, _, err := LoadTrusted(dir, nil)
	return m, err
}

// LoadTrusted is Load that also refuses, with trusted keys, an image whose manifest is not
// signed by one of them, and returns the signer's key ID. The bytes checked are the bytes
// decoded: the manifest is read once.
func LoadTrusted(dir string, trusted signing.Keys) (*Manifest, string, error) {
	b, err := readSealed(dir)
	if err != nil {
		return nil, "", err
	}
	signer, err := checkSigned(dir, b, trusted)
	if err != nil {
		return nil, "", err
	}
	m, err := decode(b)
	if err != nil {
		return nil, "", err
	}
	if len(trusted) > 0 && !m.Digested() {
		return nil, "", fmt.Errorf("%w: its manifest records no SHA-256 of its files (signed by an older gpucr), so the signature does not cover their bytes; sign it again with `gpucr sign %s --key KEY`",
			signing.ErrUntrusted, dir)
	}
	return m, signer, nil
}

// decode decodes and checks manifest bytes whose format and seal were checked.
func decode(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, &CorruptError{ManifestName, "invalid JSON: " + err.Error()}
	}
	if reason := m.problem(); reason != "" {
		return nil, &CorruptError{ManifestName, reason}
	}
	return &m, nil
}

// readSealed reads the manifest's bytes of the image at dir and checks them against the seal.
func readSealed(dir string) ([]byte, error) {
	if err := refuseStaging(dir); err != nil {
		return nil, err
	}
	b, err := beneath.ReadFile(dir, ManifestName, maxManifest)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
			return nil, sentinelf(ErrNoManifest, "%s does not exist: give the image directory a checkpoint wrote", dir)
		}
		return nil, sentinelf(ErrNoManifest, "%s is not a gpucr image: no %s", dir, ManifestName)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest of %s: %w", dir, err)
	}
	if err := checkFormat(b); err != nil {
		return nil, err
	}
	if err := checkSeal(dir, b); err != nil {
		return nil, err
	}
	return b, nil
}

// refuseStaging refuses dir if it is an unfinished checkpoint's staging directory.
func refuseStaging(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", dir, err)
	}
	if base := filepath.Base(abs); strings.HasPrefix(base, ".") && strings.Contains(base, partialMark) {
		return sentinelf(ErrNoManifest, "%s is not a gpucr image: it is an unfinished checkpoint's staging directory", dir)
	}
	return nil
}

// maxManifest is the largest manifest read: far more than a tree of thousands of
// processes lists, far less than a file that is no manifest could fill memory with.
const maxManifest = 64 << 20

// checkFormat refuses manifest bytes of a format newer than this gpucr's. The version is
// read alone: a newer format may not decode as this one.
func checkFormat(manifest []byte) error {
	var head struct {
		FormatVersion int `json:"formatVersion"`
	}
	if err := json.Unmarshal(manifest, &head); err != nil {
		return &CorruptError{ManifestName, "invalid JSON: " + err.Error()}
	}
	if head.FormatVersion > FormatVersion {
		return sentinelf(ErrNewerFormat, "image format %d is newer than this gpucr supports (%d); upgrade gpucr",
			head.FormatVersion, FormatVersion)
	}
	return nil
}

// Parse checks and decodes a manifest from its bytes and its seal's, as Load does from a
// directory: for an image in an archive, read without writing it out.
func Parse(manifest, sealFile []byte) (*Manifest, error) {
	if err := checkFormat(manifest); err != nil {
		return nil, err
	}
	if err := compareSeal(manifest, sealFile); err != nil {
		return nil, err
	}
	return decode(manifest)
}

// seal is the hex SHA-256 of a manifest's bytes.
func seal(manifest []byte) string {
	sum := sha256.Sum256(manifest)
	return hex.EncodeToString(sum[:])
}

// checkSeal compares the manifest's bytes with the seal committed beside them. It runs
// after the format check, so that a newer gpucr may seal differently.
func checkSeal(dir string, manifest []byte) error {
	limit, _ := ManifestFileLimit(SealName)
	b, err := beneath.ReadFile(dir, SealName, limit)
	if errors.Is(err, fs.ErrNotExist) {
		return &CorruptError{SealName, "missing: the manifest cannot be checked"}
	}
	if err != nil {
		return fmt.Errorf("read %s of %s: %w", SealName, dir, err)
	}
	return compareSeal(manifest, b)
}

// compareSeal compares the manifest's bytes with the seal file's.
func compareSeal(manifest, sealFile []byte) error {
	if sealFile == nil {
		return &CorruptError{SealName, "missing: the manifest cannot be checked"}
	}
	// Two lines only while Sign replaces the manifest (replaceManifest).
	lines := strings.Fields(string(sealFile))
	if len(lines) > 2 || !slices.Contains(lines, seal(manifest)) {
		return &CorruptError{ManifestName, "does not match " + SealName + ": the manifest was changed or damaged"}
	}
	return nil
}

// problem says what makes m unusable, or "" if nothing does. File paths must be clean and
// inside the image: Verify and restore open them relative to the image directory.
func (m *Manifest) problem() string {
	switch {
	case m.FormatVersion < 1:
		return "no format version"
	case m.RootPID <= 0:
		return "no root PID"
	case len(m.Files) == 0:
		return "no files listed"
	}
	if reason := m.processProblem(); reason != "" {
		return reason
	}
	if reason := m.linkedProblem(); reason != "" {
		return reason
	}
	seen := make(map[string]bool, len(m.Files))
	var total int64
	for _, f := range m.Files {
		switch {
		case !filepath.IsLocal(f.Path) || path.Clean(f.Path) != f.Path || f.Path == ".":
			return fmt.Sprintf("file path %q is not inside the image", f.Path)
		case f.Size < 0 || !IsXXH64(f.XXH64) || (f.Strong() && !IsSHA256(f.SHA256)):
			return fmt.Sprintf("file %s has an invalid size or checksum", f.Path)
		case seen[f.Path]:
			return fmt.Sprintf("file %s is listed twice", f.Path)
		case neverListed(f.Path):
			return fmt.Sprintf("file %s is listed, but a manifest never lists its own files or CRIU's logs", f.Path)
		case f.Size > MaxImageBytes-total:
			return fmt.Sprintf("files listed up to %s hold more than %d TiB, more than any image gpucr writes", f.Path, MaxImageBytes>>40)
		}
		seen[f.Path] = true
		total += f.Size
	}
	return ""
}

// MaxImageBytes bounds what an image's files may hold in all, holes included: far above the
// memory of any host (a GPU node's devices and host memory are a few TiB), and low enough
// that the digests of its pieces (a few words per 8 MiB) fit in memory. A sparse file of
// 2^62 bytes listed in a crafted manifest made verify and restore allocate beyond any
// host's memory and die (hostile test).
const MaxImageBytes int64 = 64 << 40

// MaxProcesses bounds the processes an image may list: a restore takes a lock, and a
// descriptor, for each, and a crafted manifest of 100,000 ran it out of descriptors after
// 21 s with an error that named no image (hostile test). Far above any job's tree.
const MaxProcesses = 32768

// maxPID is the kernel's largest PID (PID_MAX_LIMIT on 64-bit).
const maxPID = 1 << 22

// processProblem checks the PIDs an image names: a restore signals, fills and restores
// processes by them, so each must be a real PID of the image's own tree, named once.
func (m *Manifest) processProblem() string {
	if len(m.Processes) > MaxProcesses {
		return fmt.Sprintf("it lists %d processes, more than the %d of any tree gpucr checkpoints", len(m.Processes), MaxProcesses)
	}
	pids := make(map[int]bool, len(m.Processes))
	for _, p := range m.Processes {
		switch {
		case p.PID <= 0 || p.PID > maxPID:
			return fmt.Sprintf("process PID %d is not a PID", p.PID)
		case pids[p.PID]:
			return fmt.Sprintf("process %d is listed twice", p.PID)
		}
		pids[p.PID] = true
	}
	if !pids[m.RootPID] {
		return fmt.Sprintf("root PID %d is not among the image's processes", m.RootPID)
	}
	return m.gpuProblem(pids)
}

// gpuProblem checks the image's GPU snapshots (gpu.Problem) and that each GPU process, and
// each process holding device files, is one of the image's processes (pids): holders of
// PID 0, -5 or outside the tree passed verify and restore, a restore then loading CRIU's
// plugin for no process, or refused on a host without it as needed by "process 0"
// (hostile test).
func (m *Manifest) gpuProblem(pids map[int]bool) string {
	if reason := gpu.Problem(m.GPUs); reason != "" {
		return reason
	}
	for _, s := range m.GPUs {
		for _, p := range s.Processes {
			if !pids[p.PID] {
				return fmt.Sprintf("GPU process %d is not among the image's processes", p.PID)
			}
		}
		for _, pid := range s.FileHolders {
			if !pids[pid] {
				return fmt.Sprintf("process %d holding %s device files is not among the image's processes", pid, s.Backend)
			}
		}
	}
	return ""
}

// CheckListed refuses an image directory that holds anything its manifest does not list
// (beside the manifest, its seal, its signatures and CRIU's logs): an extra file, a symlink, a device. Restore reads only
// listed files, and an image with more in it was changed after its checkpoint.
func CheckListed(dir string, m *Manifest) error {
	listed := make(map[string]bool, len(m.Files))
	for _, f := range m.Files {
		listed[f.Path] = true
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return &CorruptError{rel, "not a regular file: an image holds only regular files and directories"}
		case listed[rel] || neverListed(rel):
			return nil
		}
		return &CorruptError{rel, "not listed in the manifest: the image was changed after its checkpoint"}
	})
}

// neverListed says whether p names a file an image holds that its manifest never lists:
// the manifest, its seal and its signatures, what an interrupted Sign left of them (never
// read, removed by the next one), and CRIU's logs (for people, never read by a restore).
// Listed in a crafted manifest, such a file passed verify, and then Sign removed or
// replaced it, leaving an image that no longer verified (hostile test).
func neverListed(p string) bool {
	name := strings.TrimSuffix(p, beneath.ReplaceSuffix)
	return name == ManifestName || name == SealName || name == SigName || path.Dir(p) == LogsDir
}

// Verify checks every file of m in dir and returns a *CorruptError for the first wrong one
// in path order. Sizes are checked first, so a truncated image fails without being read;
// then checksums, in parallel.
func Verify(dir string, m *Manifest) error {
	if err := CheckSizes(dir, m.Files); err != nil {
		return err
	}
	return CheckSums(dir, m.Files)
}

// CheckSizes checks that each of files is in dir, a regular file of its size: cheap, and
// enough to find a truncated image. It returns a *CorruptError for the first wrong one in
// path order.
func CheckSizes(dir string, files []File) error {
	for _, f := range sortedFiles(files) {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return &CorruptError{f.Path, "missing"}
		case err != nil:
			return fmt.Errorf("verify %s in %s: %w", f.Path, dir, err)
		case !fi.Mode().IsRegular():
			return &CorruptError{f.Path, "not a regular file"}
		case fi.Size() != f.Size:
			return &CorruptError{f.Path, fmt.Sprintf("size %d, want %d (truncated or changed)", fi.Size(), f.Size)}
		}
	}
	return nil
}

// CheckSums recomputes the checksums of each of files in dir (its SHA-256 too where it
// records one), in parallel, and returns a *CorruptError for the first wrong one in path
// order. Sizes must have been checked.
func CheckSums(dir string, files []File) error {
	files, got, err := recompute(dir, files, File.Strong)
	if err != nil {
		return err
	}
	for i, f := range files {
		if err := f.same(got[i]); err != nil {
			return err
		}
	}
	return nil
}

// recompute returns files sorted by path, and their entries computed from their bytes in
// dir, with the SHA-256 of those strong says.
func recompute(dir string, files []File, strong func(File) bool) (sorted, got []File, err error) {
	sorted = sortedFiles(files)
	paths := make([]string, len(sorted))
	for i, f := range sorted {
		paths[i] = f.Path
	}
	// Not yet cancellable: the engine passes no context here until issue 14's rewrite of it.
	got, err = sumFiles(context.Background(), dir, paths, false, func(i int) bool { return strong(sorted[i]) })
	if err != nil {
		return nil, nil, fmt.Errorf("verify %s: %w", dir, err)
	}
	return sorted, got, nil
}

// same returns a *CorruptError unless got, computed from the file's bytes, has f's
// checksums.
func (f File) same(got File) error {
	switch {
	case got.XXH64 != f.XXH64:
		return Mismatch(f, got.XXH64)
	case got.SHA256 != f.SHA256:
		return &CorruptError{f.Path, fmt.Sprintf("SHA-256 mismatch (want %s, got %s): changed after it was signed", f.SHA256, got.SHA256)}
	}
	return nil
}

// Mismatch is the error for file f whose bytes checksum to got instead of f's checksum.
func Mismatch(f File, got string) *CorruptError {
	return &CorruptError{f.Path, fmt.Sprintf("checksum mismatch (want %s, got %s)", f.XXH64, got)}
}

func sortedFiles(files []File) []File {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return files
}

// Open loads an image and verifies all its files: what restore accepts.
func Open(dir string) (*Manifest, error) {
	m, _, err := OpenTrusted(dir, nil)
	return m, err
}

// OpenTrusted is Open that also checks the image's signature as LoadTrusted does.
func OpenTrusted(dir string, trusted signing.Keys) (*Manifest, string, error) {
	m, signer, err := LoadTrusted(dir, trusted)
	if err != nil {
		return nil, "", err
	}
	if err := CheckListed(dir, m); err != nil {
		return nil, "", err
	}
	if err := Verify(dir, m); err != nil {
		return nil, "", err
	}
	return m, signer, nil
}

// checkSigned refuses the manifest bytes of the image at dir unless they carry a signature
// by one of trusted, and returns the signer's key ID. With no trusted keys it asks nothing.
func checkSigned(dir string, manifest []byte, trusted signing.Keys) (string, error) {
	if len(trusted) == 0 {
		return "", nil
	}
	sig, err := beneath.ReadFile(dir, SigName, maxSigFile)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: it is not signed", signing.ErrUntrusted)
	}
	if err != nil {
		return "", fmt.Errorf("read %s of %s: %w", SigName, dir, err)
	}
	return trusted.Check(manifest, sig)
}

// Signed is what Sign did: the key that signed, and the other keys whose signatures it
// dropped, because they covered a manifest without SHA-256 digests.
type Signed struct {
	KeyID   string
	Dropped []string
}

// Sign verifies every file of the image at dir and adds a signature by key, keeping other
// keys' well-formed signatures. An image whose manifest records no SHA-256 of its files
// (checkpointed unsigned, or by an older gpucr) gets them first, computed in the same read
// that verifies the files, and a manifest rewritten with them; the other keys' signatures
// of the old manifest are dropped. Every step is a rename, and at every point the image is
// whole. The image's directory, named by a path without symlinks, is held open, read only
// through it (a rename of it, or of a directory above, cannot swap another in between two
// reads) and written only through it, by names never followed, once it is known to be still
// at dir: whoever else can write it cannot make root write or read elsewhere.
func Sign(dir string, key ed25519.PrivateKey) (*Signed, error) {
	if err := refuseStaging(dir); err != nil {
		return nil, err
	}
	d, err := beneath.OpenDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	defer d.Close()
	for _, name := range []string{ManifestName, SealName, SigName} {
		if err := d.Remove(name + beneath.ReplaceSuffix); err != nil { // an interrupted signing's
			return nil, err
		}
	}
	old, m, files, got, err := readHeld(d.Within())
	if err != nil {
		return nil, namedAs(err, d.Within(), dir)
	}
	for i, f := range files {
		g := got[i]
		if !f.Strong() {
			g.SHA256 = ""
		}
		if err := f.same(g); err != nil {
			return nil, err
		}
	}
	crashpoint.Hit("sign: files read")
	// What was read must be what is written: the directory held, still at dir.
	if !d.Is(dir) {
		return nil, fmt.Errorf("sign %s: the directory was replaced while it was read; nothing was written", dir)
	}
	id := signing.ID(key.Public().(ed25519.PublicKey))
	res := &Signed{KeyID: id}
	sigs, err := d.ReadFile(SigName, maxSigFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s of %s: %w", SigName, dir, err)
	}
	others := signing.Others(sigs, id)
	manifest := old
	if !m.Digested() {
		m.FormatVersion = FormatVersion // written again, by this gpucr
		m.Files = got
		if manifest, err = encode(m); err != nil {
			return nil, err
		}
		res.Dropped = signing.IDs(others)
		others = nil
		if err := replaceManifest(d, old, manifest); err != nil {
			return nil, fmt.Errorf("write the manifest of %s with SHA-256 digests: %w", dir, err)
		}
	}
	if err := d.Replace(SigName, append(others, signing.Sign(key, manifest)...)); err != nil {
		return nil, fmt.Errorf("sign %s: %w", dir, err)
	}
	return res, nil
}

// readHeld reads what Sign signs of the image at within (the directory Sign holds): the
// manifest, as bytes checked against the seal and decoded, checked against what the
// directory holds, and every file, sorted as recompute sorts them, with what its bytes
// hash to.
func readHeld(within string) (manifest []byte, m *Manifest, files, got []File, err error) {
	if manifest, err = readSealed(within); err != nil {
		return nil, nil, nil, nil, err
	}
	if m, err = decode(manifest); err != nil {
		return nil, nil, nil, nil, err
	}
	if err := CheckListed(within, m); err != nil {
		return nil, nil, nil, nil, err
	}
	if err := CheckSizes(within, m.Files); err != nil {
		return nil, nil, nil, nil, err
	}
	files, got, err = recompute(within, m.Files, func(File) bool { return true })
	return manifest, m, files, got, err
}

// namedAs is err with the path within written as dir in its message, for the user who
// named the image by dir; errors.Is and errors.As see err.
func namedAs(err error, within, dir string) error {
	return renamedError{err, strings.TrimSuffix(within, "/"), dir}
}

type renamedError struct {
	err      error
	from, to string
}

func (e renamedError) Error() string { return strings.ReplaceAll(e.err.Error(), e.from, e.to) }
func (e renamedError) Unwrap() error { return e.err }

// ManifestFileLimit is the most a file of the manifest's own (the manifest, its seal, its
// signatures) may hold, by name, and false for any other file: what reads them reads no
// more, so a fetch need fetch no more either.
func ManifestFileLimit(path string) (int64, bool) {
	switch path {
	case ManifestName:
		return maxManifest, true
	case SealName:
		return 1 << 10, true
	case SigName:
		return maxSigFile, true
	}
	return 0, false
}

// maxSigFile is the most a signature file may hold: a line per key.
const maxSigFile = 64 << 10

// replaceManifest puts manifest in place of the image's old one, and a seal for it, so
// that a crash at any point leaves an image that loads: the seal first lists both
// manifests' digests, the old manifest's signatures go, the manifest is replaced, and the
// seal lists the new one only. A seal only finds damage (whoever can write the image can
// write it), so accepting either of two digests for a moment weakens nothing.
func replaceManifest(d *beneath.Dir, old, manifest []byte) error {
	if err := d.Replace(SealName, []byte(seal(old)+"\n"+seal(manifest)+"\n")); err != nil {
		return err
	}
	crashpoint.Hit("sign: both manifests sealed")
	if err := d.Remove(SigName); err != nil { // the old manifest's signatures: void with it
		return err
	}
	crashpoint.Hit("sign: old signatures removed")
	if err := d.Replace(ManifestName, manifest); err != nil {
		return err
	}
	crashpoint.Hit("sign: manifest replaced")
	return d.Replace(SealName, []byte(seal(manifest)+"\n"))
}

// MaxLinkedFile is the most bytes a linked file of the manifest may hold: the most a
// semaphore's file the checkpoint carries may hold (glibc's are 32).
const MaxLinkedFile = safety.MaxSemaphore

// Names a linked file may have: a restore creates them, as root, in /dev/shm.
var (
	linkedPath  = regexp.MustCompile(`^/dev/shm/sem\.[A-Za-z0-9._-]{1,200}$`)
	linkedRemap = regexp.MustCompile(`^link_remap\.[0-9]{1,10}$`)
)

// linkedProblem checks the linked files, which a restore creates as root: each a
// semaphore's name in /dev/shm, its link CRIU's, few bytes, nothing named twice.
func (m *Manifest) linkedProblem() string {
	seen := map[string]bool{}
	for _, f := range m.LinkedFiles {
		switch {
		case !linkedPath.MatchString(f.Path):
			return fmt.Sprintf("linked file %q is not a semaphore's file in /dev/shm", f.Path)
		case !linkedRemap.MatchString(f.Remap):
			return fmt.Sprintf("linked file %s has an invalid link name %q", f.Path, f.Remap)
		case len(f.Data) > MaxLinkedFile:
			return fmt.Sprintf("linked file %s holds %d bytes, more than %d", f.Path, len(f.Data), MaxLinkedFile)
		case f.Mode&^0o777 != 0:
			return fmt.Sprintf("linked file %s has an invalid mode %o", f.Path, f.Mode)
		case seen[f.Path] || seen[f.Remap]:
			return fmt.Sprintf("linked file %s or its link %s is listed twice", f.Path, f.Remap)
		}
		seen[f.Path], seen[f.Remap] = true, true
	}
	return ""
}
