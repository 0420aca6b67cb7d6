package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/txn"
)

// What gpucr's post-restore hook finds in the restore's work directory: the plan of the
// memory it fills (absent when there is none), the verdict on the image's memory, the
// record of its run, and its log.
const (
	planName    = "fill-plan.json"
	verdictName = "verdict"
	doneName    = "post-restore.done"
	hookLog     = "post-restore.log"
	verdictOK   = "ok"
)

// postRestoreHook sets up what holds the restored container's tasks at post-restore,
// every one restored and none resumed, until the image is verified, and fills plan's
// memory into them: a CRIU configuration, named in CRIU's environment, whose action script
// is gpucr's criu-action --post-restore. The hook gives up if owner, the restoring gpucr,
// dies. It returns the environment to add to runc's.
func postRestoreHook(work, gpucr string, plan *memfill.Plan, owner txn.Proc) ([]string, error) {
	if plan != nil {
		if err := plan.WriteFile(filepath.Join(work, planName)); err != nil {
			return nil, err
		}
	}
	script := filepath.Join(work, "post-restore-action")
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

// writeVerdict tells the hook in work whether the image's memory is whole: "ok", or why not.
func writeVerdict(work string, verified error) {
	v := verdictOK
	if verified != nil {
		v = verified.Error()
	}
	tmp := filepath.Join(work, verdictName+".tmp")
	// A failure leaves the hook waiting for its owner, which is how a lost verdict is seen.
	if os.WriteFile(tmp, []byte(v), 0o600) == nil {
		_ = os.Rename(tmp, filepath.Join(work, verdictName))
	}
}

// PostRestore is criu-action --post-restore: it waits for the restoring gpucr's verdict on
// the image, then writes the plan's memory into the restored container, whose init CRIU
// names, and records how long that took. A damaged image, or the death of owner, fails the
// step, and CRIU kills the tasks. CRIU may run an action script twice per step; the second
// run finds the first's record and does nothing.
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
	if err := waitVerdict(ctx, work, owner); err != nil {
		return err
	}
	var took time.Duration
	plan, err := memfill.ReadPlan(filepath.Join(work, planName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if took, err = fill(ctx, getenv, plan); err != nil {
			return err
		}
		log.Info("memory filled", "bytes", plan.Bytes(), "seconds", took.Seconds())
	}
	return os.WriteFile(done, []byte(strconv.FormatInt(int64(took), 10)+"\n"), 0o600)
}

// waitVerdict waits for the verdict on the image's memory as long as owner lives.
func waitVerdict(ctx context.Context, work string, owner txn.Proc) error {
	for {
		b, err := os.ReadFile(filepath.Join(work, verdictName))
		switch {
		case err == nil && string(b) == verdictOK:
			return nil
		case err == nil:
			return errors.New(string(b))
		case !owner.Alive():
			return fmt.Errorf("gpucr (PID %d), which runs this restore, is gone before the image was verified", owner.PID)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// fill writes plan's memory into the container whose init CRIU names.
func fill(ctx context.Context, getenv func(string) string, plan *memfill.Plan) (time.Duration, error) {
	root, err := strconv.Atoi(getenv(envInitPID))
	if err != nil || root <= 0 {
		return 0, fmt.Errorf("memory fill: CRIU gave no usable %s (%q)", envInitPID, getenv(envInitPID))
	}
	host, err := hostPIDs(root)
	if err != nil {
		return 0, fmt.Errorf("memory fill: %w", err)
	}
	if err := plan.Renumber(host); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := plan.Fill(ctx); err != nil {
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

// hookTook is how long the hook in work spent filling memory, once it ran.
func hookTook(work string) (time.Duration, bool) {
	b, err := os.ReadFile(filepath.Join(work, doneName))
	if err != nil {
		return 0, false
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns), err == nil
}
