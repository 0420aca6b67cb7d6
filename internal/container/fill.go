package container

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/memfill"
)

// The fill's plan in the restore's work directory, the suffix of the record of its run, and
// its log.
const (
	planName   = "fill-plan.json"
	doneSuffix = ".done"
	fillLog    = "fill-action.log"
)

// fillHook sets up what writes plan's memory into the container while runc restores it:
// a CRIU configuration, named in CRIU's environment, whose action script is gpucr's
// criu-action with --fill, which CRIU runs at post-restore with every process restored and
// none resumed. It returns the environment to add to runc's.
func fillHook(work, gpucr string, plan *memfill.Plan) ([]string, error) {
	planPath := filepath.Join(work, planName)
	if err := plan.WriteFile(planPath); err != nil {
		return nil, err
	}
	script := filepath.Join(work, "fill-action")
	body := fmt.Sprintf("#!/bin/sh\nexec %s criu-action --fill %s --log %s\n",
		shellQuote(gpucr), shellQuote(planPath), shellQuote(filepath.Join(work, fillLog)))
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		return nil, fmt.Errorf("memory fill: %w", err)
	}
	conf := filepath.Join(work, "fill-criu.conf")
	if err := os.WriteFile(conf, []byte("action-script "+script+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("memory fill: %w", err)
	}
	return []string{"CRIU_CONFIG_FILE=" + conf}, nil
}

// Fill is criu-action --fill: at post-restore it writes the memory of the plan at planPath
// into the restored container, whose init CRIU names, and records how long that took for
// the restore to report. CRIU may run an action script twice per step; the second run
// finds the first's record and does nothing.
func Fill(ctx context.Context, getenv func(string) string, planPath string, log *slog.Logger) (err error) {
	if getenv(envAction) != "post-restore" {
		return nil
	}
	defer func() {
		if err != nil {
			log.Error("memory fill failed", "err", err) // the restore reads it back from the log
		}
	}()
	done := planPath + doneSuffix
	if _, err := os.Stat(done); err == nil {
		log.Info("memory already filled by this step's first run")
		return nil
	}
	root, err := strconv.Atoi(getenv(envInitPID))
	if err != nil || root <= 0 {
		return fmt.Errorf("memory fill: CRIU gave no usable %s (%q)", envInitPID, getenv(envInitPID))
	}
	plan, err := memfill.ReadPlan(planPath)
	if err != nil {
		return err
	}
	host, err := hostPIDs(root)
	if err != nil {
		return fmt.Errorf("memory fill: %w", err)
	}
	if err := plan.Renumber(host); err != nil {
		return err
	}
	start := time.Now()
	if err := plan.Fill(ctx); err != nil {
		return err
	}
	took := time.Since(start)
	log.Info("memory filled", "bytes", plan.Bytes(), "seconds", took.Seconds())
	return os.WriteFile(done, []byte(strconv.FormatInt(int64(took), 10)+"\n"), 0o600)
}

// fillFailure is the error the fill in work logged, or "".
func fillFailure(work string) string {
	b, err := os.ReadFile(filepath.Join(work, fillLog))
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

// fillTook is how long the fill of the plan in work took, once it ran.
func fillTook(work string) (time.Duration, bool) {
	b, err := os.ReadFile(filepath.Join(work, planName+doneSuffix))
	if err != nil {
		return 0, false
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns), err == nil
}
