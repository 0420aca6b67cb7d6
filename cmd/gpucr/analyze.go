package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/safety"
)

// checkpointSkips reads checkpoint's --skip-check names: restorability checks only.
func checkpointSkips(names []string) (safety.Skips, error) {
	s, rest, err := safety.SkipsFrom(names)
	if err != nil {
		return nil, usageError{err}
	}
	if len(rest) > 0 {
		return nil, usageError{fmt.Errorf("unknown check %q: checkpoint's checks are %s", rest[0], skippableChecks())}
	}
	return s, nil
}

func skippableChecks() string {
	var names []string
	for _, r := range safety.Rules() {
		if r.Skippable {
			names = append(names, r.Name)
		}
	}
	return strings.Join(names, ", ")
}

// dryRun prints what a checkpoint of target would refuse, and fails if anything.
func (a *app) dryRun(cmd *cobra.Command, target func(*engine.Engine) engine.Target, r engine.CheckpointRequest) error {
	var res *engine.Analysis
	err := a.withEngine(cmd, r.Options, func(ctx context.Context, e *engine.Engine) (err error) {
		res, err = e.Analyze(ctx, target(e), r)
		return err
	})
	if err != nil {
		return classifyContainer(err)
	}
	if err := a.emit(res, func() { printAnalysis(a.stdout, res) }); err != nil {
		return err
	}
	if len(res.Findings) > 0 {
		// The document printed holds the findings: --json printed the error's after it, two
		// documents where json.md promises one (documentation walk).
		return inOutput{fmt.Errorf("a checkpoint would be refused: %d finding(s)", len(res.Findings))}
	}
	return nil
}

// printAnalysis writes what --dry-run found. A process's name and the paths it holds are
// its user's to choose: they are shown without their control characters (a hostile test's
// process name drove root's terminal).
func printAnalysis(w io.Writer, res *engine.Analysis) {
	fmt.Fprintf(w, "%d processes, %d with GPU state: ", res.Processes, len(res.GPUProcesses))
	if len(res.Findings) == 0 {
		fmt.Fprintln(w, "nothing found that would stop a checkpoint or its restore")
	} else {
		fmt.Fprintf(w, "%d finding(s), a checkpoint would be refused\n", len(res.Findings))
	}
	for _, f := range res.Findings {
		fmt.Fprintf(w, "  %s: process %d (%s) %s\n    fix: %s\n", f.Check, f.PID, printable(f.Command), printable(f.Reason), printable(f.Fix))
	}
	for _, c := range res.Carried {
		who := printable(c.Path)
		if c.PID != 0 {
			who = fmt.Sprintf("process %d (%s)", c.PID, printable(c.Command))
		}
		fmt.Fprintf(w, "  carried: %s: %s\n", who, c.What)
	}
}
