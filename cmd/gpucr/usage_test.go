package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A store URL where a local directory is wanted (-D, pull's and push's DIR) was taken for a
// path: "parent directory s3:/bucket of image directory s3:/bucket/x does not exist", exit
// 1, or "not a gpucr image" for arguments given the wrong way round (UX review). It is a
// usage error saying where a store location goes.
func TestStoreURLWhereADirectoryIsWantedIsAUsageError(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"checkpoint", "1", "-D", "s3://b/x"}, "give that location to --to"},
		{[]string{"restore", "-D", "s3://b/x"}, "give that location to --from"},
		{[]string{"pull", t.TempDir(), "s3://b/y"}, "store location first"},
		{[]string{"push", "s3://b/x", t.TempDir()}, "image directory first"},
	} {
		var stdout, stderr strings.Builder
		code := run(tt.args, &stdout, &stderr)
		if msg := stderr.String(); code != exitUsage || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tt.want) {
			t.Errorf("gpucr %s: exit %d, want %d and one line with %q:\n%s", strings.Join(tt.args, " "), code, exitUsage, tt.want, msg)
		}
	}
}

// cobra's refusals of a command line said "accepts 2 arg(s), received 0" with no word of
// which, quoted strconv for a bad number, and made "Did you mean this?" a run of semicolons
// on one line (UX review): each says how the verb is used, in plain words, on one line.
func TestCommandLineRefusalsSayHowTheVerbIsUsed(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"pull"}, "(usage: gpucr pull s3://BUCKET/PREFIX|PATH DIR"},
		{[]string{"run", "--nproc-per-node", "abc", "--", "true"}, `"--nproc-per-node" flag: not a number (see gpucr run --help)`},
		{[]string{"checkpoint", "1", "--lock-timeout", "banana"}, "not a duration"},
		{[]string{"checkpoint", "1", "--lock-timeout", "5"}, `"--lock-timeout" flag: not a duration (as 90s or 5m)`},
		{[]string{"check", "--json=maybe"}, `"--json" flag: not true or false`},
		{[]string{"recover", "--pid", "1,abc"}, `"--pid" flag: not a number`},
		{[]string{"chekpoint"}, `unknown command "chekpoint" for "gpucr": did you mean checkpoint? (see gpucr --help)`},
	} {
		var stdout, stderr strings.Builder
		code := run(tt.args, &stdout, &stderr)
		if msg := stderr.String(); code != exitUsage || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tt.want) || strings.Contains(msg, "strconv") {
			t.Errorf("gpucr %s: exit %d, want %d and one line with %q:\n%s", strings.Join(tt.args, " "), code, exitUsage, tt.want, msg)
		}
	}
}

// A local store was made with all its missing parents (mkdir -p), so a mistyped path or an
// unmounted /mnt/... silently started a store on the wrong disk. As for -D, the store
// directory (the one that holds the checkpoint and chunks/) may be made, its parent must
// exist: exit 2, one line naming that parent, and nothing created.
func TestLocalStoreWithoutItsParentIsRefused(t *testing.T) {
	tmp := t.TempDir()
	missing := filepath.Join(tmp, "typo")
	storeDir := filepath.Join(missing, "ckpt")
	loc := filepath.Join(storeDir, "job-3")
	noPID := "4194305" // above any pid_max: were the location taken, no process is checkpointed
	for _, args := range [][]string{
		{"checkpoint", noPID, "--to", loc},
		{"checkpoint", noPID, "-D", filepath.Join(tmp, "img"), "--to", loc},
		{"push", t.TempDir(), loc},
	} {
		var stdout, stderr strings.Builder
		code := run(args, &stdout, &stderr)
		want := "parent directory " + missing + " of store directory " + storeDir + " does not exist"
		if msg := stderr.String(); code != exitUsage || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, want) {
			t.Errorf("gpucr %s: exit %d, want %d and one line with %q:\n%s", strings.Join(args, " "), code, exitUsage, want, msg)
		}
		if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("gpucr %s created %s (%v)", strings.Join(args, " "), missing, err)
		}
	}
}

// An --import without -D was told only "restore needs --images-dir DIR, or --from
// LOCATION", and one without --container unpacked the archive into DIR, then failed (exit
// 1) as a process tree's restore, leaving DIR full (documentation walk). Both are refused
// first, exit 2, and nothing is unpacked.
func TestImportWithoutItsDirectoryOrContainerIsRefusedFirst(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "trainer.tar.zst")
	if err := os.WriteFile(archive, []byte("not read"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "img")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"restore", "--container", "c", "--import", archive}, "needs -D DIR"},
		{[]string{"restore", "--import", archive, "-D", dir}, "needs --container ID"},
	} {
		var stdout, stderr strings.Builder
		code := run(tt.args, &stdout, &stderr)
		if msg := stderr.String(); code != exitUsage || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tt.want) {
			t.Errorf("gpucr %s: exit %d, want %d and one line with %q:\n%s", strings.Join(tt.args, " "), code, exitUsage, tt.want, msg)
		}
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("gpucr %s made %s (%v)", strings.Join(tt.args, " "), dir, err)
		}
	}
}

// A flag only a container's checkpoint or restore reads, given without --container, was
// passed over: `checkpoint PID -D DIR --runc-root R` checkpointed the tree, which stopped
// (documentation walk). It is refused, exit 2, naming the flag, before anything is done.
func TestContainerFlagsWithoutAContainerAreRefused(t *testing.T) {
	noPID := "4194305" // above any pid_max: were the flag passed over, no process is checkpointed
	dir := filepath.Join(t.TempDir(), "img")
	for _, tt := range []struct {
		args []string
		flag string
	}{
		{[]string{"checkpoint", noPID, "-D", dir, "--runc-root", t.TempDir()}, "--runc-root"},
		{[]string{"checkpoint", noPID, "-D", dir, "--runc", "/usr/sbin/runc"}, "--runc"},
		{[]string{"restore", "-D", dir, "--runc-root", t.TempDir()}, "--runc-root"},
		{[]string{"restore", "-D", dir, "--new-id", "c2"}, "--new-id"},
		{[]string{"restore", "-D", dir, "--bundle", t.TempDir()}, "--bundle"},
	} {
		var stdout, stderr strings.Builder
		code := run(tt.args, &stdout, &stderr)
		want := tt.flag + " needs --container ID"
		if msg := stderr.String(); code != exitUsage || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, want) {
			t.Errorf("gpucr %s: exit %d, want %d and one line with %q:\n%s", strings.Join(tt.args, " "), code, exitUsage, want, msg)
		}
	}
}
