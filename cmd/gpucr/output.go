package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/txn"
)

// Exit codes: 1 the operation failed; 2 the request was wrong; 3 the host is not ready.
const (
	exitFailed   = 1
	exitUsage    = 2
	exitNotReady = 3
)

// jsonSchema is the version of the --json output that docs/json.md describes.
const jsonSchema = 3

// explainInterrupt leads msg, the message of err, with the signal that cancelled the verb
// when err is that cancellation: "context canceled" alone does not say that the user (or
// whoever sent it) asked gpucr to stop.
func explainInterrupt(msg string, err error, sig os.Signal) string {
	s, ok := sig.(syscall.Signal)
	if !ok || !errors.Is(err, context.Canceled) {
		return msg
	}
	return fmt.Sprintf("interrupted by %s: %s", unix.SignalName(s), msg)
}

// usageError marks errors in what the user asked for.
type usageError struct{ error }

// localDir refuses, as a usage error, a store URL given where a local directory is wanted
// (what names it, as "-D" or "push's DIR"); instead says where a store location goes. A URL
// there was taken for a path ("parent directory s3:/bucket ... does not exist", UX test).
func localDir(what, dir, instead string) error {
	if strings.Contains(dir, "://") {
		return usageError{fmt.Errorf("%s takes a local directory, not %s: %s", what, dir, instead)}
	}
	return nil
}

func (u usageError) Unwrap() error { return u.error }

func exitCode(err error) int {
	var u usageError
	var nr notReadyError
	switch {
	case errors.As(err, &nr):
		return exitNotReady
	case errors.As(err, &u):
		return exitUsage
	}
	return exitFailed
}

// inOutput is a failure the verb's --json document already holds (with its exit code):
// stdout must hold that one document, not a second for the error.
type inOutput struct{ error }

func (e inOutput) Unwrap() error { return e.error }

// notReadyError is a host that cannot do what was asked (not root, no CRIU or too old a
// one, `gpucr check`'s findings): exit code 3, with reason as the whole message. reported
// says the verb's own output (`gpucr check`'s report) already said so, and --json must not
// print a second document.
type notReadyError struct {
	reason   string
	reported bool
}

func (n notReadyError) Error() string { return n.reason }

// emit prints v as JSON with --json, otherwise runs text.
func (a *app) emit(v any, text func()) error {
	if !a.json {
		// A result that could not be written is a failure, as with --json: a restore's PID
		// line lost to a full disk exited 0 (hostile test).
		w := &firstError{w: a.stdout}
		saved := a.stdout
		a.stdout = w
		text()
		a.stdout = saved
		if w.err != nil {
			return fmt.Errorf("write the result: %w", w.err)
		}
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// firstError is w, keeping the first error a write to it returned.
type firstError struct {
	w   io.Writer
	err error
}

func (f *firstError) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err != nil && f.err == nil {
		f.err = err
	}
	return n, err
}

// terminalSafe passes what it is given on to w with every control character but tab shown
// as '?', and a newline kept only as the last byte of a write: text an image carries (a
// hostname, a command, a path) reaches a terminal through inspect, and whoever wrote the
// image must neither drive that terminal (a hostile test set its title through a hostname)
// nor start a line of its own (such as "signed by trusted key ..."). Its users write each
// line in one write.
type terminalSafe struct{ w io.Writer }

func (t terminalSafe) Write(p []byte) (int, error) {
	clean := bytes.Map(shown, p)
	if len(p) > 0 && p[len(p)-1] == '\n' {
		clean[len(clean)-1] = '\n'
	}
	if _, err := t.w.Write(clean); err != nil {
		return 0, err
	}
	return len(p), nil
}

// shown is how a character of text that gpucr does not control (an image's, a store's,
// an error's) reaches a terminal: every control character but tab as '?'.
func shown(r rune) rune {
	if r != '\t' && unicode.IsControl(r) {
		return '?'
	}
	return r
}

// printable is s as shown on a terminal (shown), for text written other than through
// terminalSafe: a cell of a table, a line of an error.
func printable(s string) string { return strings.Map(shown, s) }

// bytesHuman is how the CLI writes a size: in binary units (64 MiB, 1.5 GiB), the units GPU
// memory and pages come in.
func bytesHuman(n uint64) string { return humanize.IBytes(n) }

func seconds(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func phasesLine(ps []image.Phase) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += "  "
		}
		s += p.Name + " " + seconds(p.Duration)
	}
	return s
}

// explainFullDisk says what to do about a checkpoint that ran out of disk. Every write of an
// image happens before the processes are let go, so they run on — once the rollback has
// put everything back; where it could not, the error says what is left as it is (review:
// it said they run on beside a GPU resume that failed). A streamed checkpoint writes to its
// store and stages CRIU's small files under TMPDIR: either may be the full one.
func explainFullDisk(err error, streamed bool) error {
	if !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	after := "the processes run on and nothing was kept"
	if _, partial := errors.AsType[*engine.RollbackError](err); partial {
		after = "nothing was kept, and the rollback did not finish"
	}
	if streamed {
		return diskFull("a disk", "a local store's, or that of "+os.TempDir()+", where a streamed checkpoint stages CRIU's small files (TMPDIR moves them), or of the run directory: free space", after, err.Error(), err)
	}
	return diskFull("the disk for the image", "free space or checkpoint elsewhere", after, err.Error(), err)
}

// outOfRoom says whether err is a write that found no room: the file system's ENOSPC or
// EDQUOT, a store's refusal for want of room, or a diskroom check refusing beforehand.
func outOfRoom(err error) bool {
	_, checked := errors.AsType[*diskroom.FullError](err)
	return checked || store.Full(err)
}

// diskFull is the one line for a destination that ran out of room, as every verb words
// it: "WHERE is full[: how much was needed]: REMEDY; AFTER (WHY)". where names the
// destination as the user gave it, why is what of the refusal is worth showing: the
// file system's own error names the file gpucr was writing, a temporary one or a chunk,
// none of the user's (UX review), so push and fold give only its reason (noRoomReason).
// err stays underneath for errors.Is.
func diskFull(where, remedy, after, why string, err error) error {
	msg := where + " is full" + roomNeeded(err) + ": " + remedy + "; " + after
	if why != "" {
		msg += " (" + why + ")"
	}
	return &fullDiskError{msg: msg, err: err}
}

// roomNeeded is how much room a diskroom check found missing, when one refused err.
func roomNeeded(err error) string {
	full, ok := errors.AsType[*diskroom.FullError](err)
	switch {
	case !ok:
		return ""
	case full.Need == 0:
		return fmt.Sprintf(": %s free, less than the %s kept for others", bytesHuman(uint64(max(full.Free, 0))), bytesHuman(uint64(full.Keep)))
	}
	return fmt.Sprintf(": %s needed, %s free, %s of it kept for others", bytesHuman(uint64(full.Need)), bytesHuman(uint64(max(full.Free, 0))), bytesHuman(uint64(full.Keep)))
}

// noRoomReason is the system's reason a write found no room ("no space left on device",
// "disk quota exceeded") without the path it came with; "" where there is none to give (a
// diskroom check, whose numbers roomNeeded says, or a store's refusal).
func noRoomReason(err error) string {
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return errno.Error()
	}
	return ""
}

// fullDiskError is diskFull's line over the error it explains.
type fullDiskError struct {
	msg string
	err error
}

func (e *fullDiskError) Error() string { return e.msg }
func (e *fullDiskError) Unwrap() error { return e.err }

// classify gives errors users act on their exit code: a wrong request is a usage error,
// a host without root or CRIU is not ready.
func classify(err error) error {
	switch {
	case errors.Is(err, engine.ErrNotRoot), errors.Is(err, engine.ErrNamespaceInit), errors.Is(err, engine.ErrForeignProc), errors.Is(err, criu.ErrNotFound), errors.Is(err, criu.ErrTooOld), errors.Is(err, txn.ErrUntrusted):
		return notReadyError{reason: err.Error()}
	case errors.Is(err, engine.ErrBadTarget), errors.Is(err, engine.ErrBadRequest), errors.Is(err, proctree.ErrNoProcess), errors.Is(err, image.ErrNotEmpty),
		errors.Is(err, image.ErrNotAPlace), errors.Is(err, image.ErrParentMissing), errors.Is(err, engine.ErrNameTooLong),
		errors.Is(err, gpu.ErrBadGPUMap):
		return usageError{err}
	}
	return err
}
