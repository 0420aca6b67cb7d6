package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// What gpucr's post-restore hook and the restoring gpucr pass each other in the restore's
// work directory: the init PID CRIU named once every task is restored (the hook's), the
// verdict on the tasks' memory (gpucr's: verified and filled, or why not), the record of
// the hook's run, and its log.
const (
	restoredName = "restored"
	verdictName  = "verdict"
	doneName     = "post-restore.done"
	hookLog      = "post-restore.log"
	verdictOK    = "ok"
)

// postRestoreHook sets up what holds the restored container's tasks at post-restore,
// every one restored and none resumed, until gpucr has verified the image and filled their
// memory: a CRIU configuration, named in CRIU's environment, whose action script is
// gpucr's criu-action --post-restore. The hook gives up if owner, the restoring gpucr,
// dies. It returns the environment to add to runc's.
func postRestoreHook(work, gpucr string, owner txn.Proc) ([]string, error) {
	script := filepath.Join(work, "post-restore-action")
	if err := checkCRIUConfigPath(script); err != nil {
		return nil, fmt.Errorf("post-restore hook: %w: set TMPDIR to a plainer directory", err)
	}
	body := fmt.Sprintf("#!/bin/sh\nexec %s criu-action --post-restore %s --owner %d:%d --log %s\n",
		shellQuote(gpucr), shellQuote(work), owner.PID, owner.Start, shellQuote(filepath.Join(work, hookLog)))
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		return nil, fmt.Errorf("post-restore hook: %w", err)
	}
	conf := filepath.Join(work, "post-restore-criu.conf")
	if err := os.WriteFile(conf, []byte("action-script "+script+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("post-restore hook: %w", err)
	}
	return []string{"CRIU_CONFIG_FILE=" + conf}, nil
}

// writeVerdict tells the hook in work whether the tasks may go: "ok", or why not. A verdict
// that cannot be written (a full TMPDIR) left the hook waiting as long as gpucr lived, and
// gpucr waiting for runc (review): the file that names the init is removed instead, which
// takes no room, and the hook takes that as a refusal.
func writeVerdict(work string, err error) error {
	v := verdictOK
	if err != nil {
		v = err.Error()
	}
	werr := writeAtomic(filepath.Join(work, verdictName), []byte(v), 0o600)
	if werr != nil {
		werr = fmt.Errorf("give the post-restore hook its verdict: %w", werr)
		if rerr := os.Remove(filepath.Join(work, restoredName)); rerr != nil {
			werr = errors.Join(werr, rerr)
		}
	}
	return werr
}

// PostRestore is criu-action --post-restore: it tells the restoring gpucr which init CRIU
// restored, waits for gpucr's verdict (the image verified and the memory gpucr restores
// itself written into the tasks), and records its run. A damaged image, a failed fill or
// the death of owner fails the step, and CRIU kills the tasks. CRIU may run an action
// script twice per step; the second run finds the first's record and does nothing.
func PostRestore(ctx context.Context, getenv func(string) string, work string, owner txn.Proc, log *slog.Logger) (err error) {
	if getenv(envAction) != "post-restore" {
		return nil
	}
	defer func() {
		if err != nil {
			log.Error("post-restore failed", "err", err) // the restore reads it back from the log
		}
	}()
	done := filepath.Join(work, doneName)
	if _, err := os.Stat(done); err == nil {
		log.Info("already done by this step's first run")
		return nil
	}
	root, err := strconv.Atoi(getenv(envInitPID))
	if err != nil || root <= 0 {
		return fmt.Errorf("CRIU gave no usable %s (%q)", envInitPID, getenv(envInitPID))
	}
	if err := writeAtomic(filepath.Join(work, restoredName), []byte(strconv.Itoa(root)), 0o600); err != nil {
		return fmt.Errorf("post-restore: %w", err)
	}
	if err := waitVerdict(ctx, work, owner); err != nil {
		return err
	}
	return os.WriteFile(done, nil, 0o600)
}

// waitVerdict waits for the verdict on the tasks as long as owner lives.
func waitVerdict(ctx context.Context, work string, owner txn.Proc) error {
	for {
		b, err := os.ReadFile(filepath.Join(work, verdictName))
		switch {
		case err == nil && string(b) == verdictOK:
			return nil
		case err == nil:
			return errors.New(string(b))
		case !exists(filepath.Join(work, restoredName)):
			return errors.New("gpucr could not give its verdict on the tasks' memory (see its error): they do not go")
		case !owner.Alive():
			return fmt.Errorf("gpucr (PID %d), which runs this restore, is gone before the tasks were verified and filled", owner.PID)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// holdTasks is the restoring gpucr's side of the hook in s.WorkDir: once the hook says
// which init CRIU restored, it calls reached, waits for the image's verification, writes s.Fill into the
// container's tasks (renumbered to their host PIDs) and gives the hook its verdict. It
// returns how long the fill took, and whether it filled them, when the hook called before
// stop closed (runc ended); and the error of a verdict it could not give.
func holdTasks(ctx context.Context, s engine.RestoreSpec, stop <-chan struct{}, reached func()) (time.Duration, bool, error) {
	var root int
	for root == 0 {
		if b, err := os.ReadFile(filepath.Join(s.WorkDir, restoredName)); err == nil {
			root, _ = strconv.Atoi(string(b))
			break
		}
		select {
		case <-stop:
			return 0, false, nil
		case <-ctx.Done():
			return 0, false, nil
		case <-time.After(5 * time.Millisecond):
		}
	}
	reached()
	took, err := fill(ctx, s, root)
	if werr := writeVerdict(s.WorkDir, err); werr != nil {
		return took, false, werr
	}
	return took, err == nil, nil
}

// exists says whether path names anything.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// fill verifies the image and writes s.Fill's memory into the container whose init is root.
func fill(ctx context.Context, s engine.RestoreSpec, root int) (time.Duration, error) {
	if err := s.Verified(); err != nil {
		return 0, err
	}
	if s.Fill == nil {
		return 0, nil
	}
	host, err := proctree.HostPIDs(root)
	if err != nil {
		return 0, fmt.Errorf("memory fill: %w", err)
	}
	if err := s.Fill.Renumber(host); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := s.Fill.Fill(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// hookFailure is the error the hook in work logged, or "".
func hookFailure(work string) string {
	b, err := os.ReadFile(filepath.Join(work, hookLog))
	if err != nil {
		return ""
	}
	why := ""
	for _, line := range strings.Split(string(b), "\n") {
		if _, e, ok := strings.Cut(line, " err="); ok && strings.Contains(line, "level=ERROR") {
			if u, err := strconv.Unquote(e); err == nil {
				e = u
			}
			why = e
		}
	}
	return why
}

// hookRan says whether the hook in work let the tasks go.
func hookRan(work string) bool {
	_, err := os.Stat(filepath.Join(work, doneName))
	return err == nil
}
