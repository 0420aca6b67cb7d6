// Command gpucr checkpoints and restores running GPU processes, process trees and
// containers. This file only wires the CLI; each verb lives in its own file.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	_ "github.com/gpucr/gpucr/internal/gpu/amd"    // registers the AMD backend
	_ "github.com/gpucr/gpucr/internal/gpu/nvidia" // registers the NVIDIA backend
	"github.com/gpucr/gpucr/internal/hosttune"
	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/txn"
)

// version is set at build time with -ldflags "-X main.version=..." (make does); without
// it, what Go recorded in the binary names the build.
var version = ""

// versionString is version, else the module version Go recorded, else the VCS revision
// the binary was built from ("-dirty" with uncommitted changes).
func versionString() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", ""
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev == "" {
		return "unknown"
	}
	return "git-" + rev + dirty
}

// app holds the global flags and the environment's configuration, and builds what the
// verbs share.
type app struct {
	cfg            config
	stdout, stderr io.Writer
	json           bool
	criuPath       string
	verbose        bool
	noTHP          bool
	log            *slog.Logger
	// quiet shows no progress; progressEvery is how often a long phase logs its progress
	// when stderr is not a terminal. shown is the one progress display, once made, and
	// shownOut what it writes stderr through.
	quiet         bool
	progressEvery time.Duration
	shown         *progress
	shownOut      *lossyWriter
	// runDir holds the journal and locks; thpSwitch is the THP switch to tune. Both are
	// hidden flags, for tests that must not share the host's.
	runDir    string
	thpSwitch string
	// cpuProfile is where the hidden --cpu-profile writes; stopProfile ends it.
	cpuProfile  string
	stopProfile func()
	// hostTrust is this host's trusted keys directory once a command asked images to be
	// signed by its keys: a refusal then says so.
	hostTrust string
}

func main() {
	// A write to a stdout or stderr whose reader has gone (`| head`) fails with EPIPE instead
	// of killing gpucr mid-checkpoint with SIGPIPE; a handled signal, unlike an ignored one,
	// is not passed on to the children gpucr starts.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	a := &app{cfg: configFrom(os.Getenv), stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	defer func() {
		if a.stopProfile != nil {
			a.stopProfile()
		}
		if a.shownOut != nil {
			a.shownOut.Close(progressFlush)
		}
	}()
	// A test-only switch: gpucr kills itself with SIGKILL at the named point (package crashpoint).
	if err := crashpoint.Arm(os.Getenv("GPUCR_TEST_CRASH_AT")); err != nil {
		fmt.Fprintf(stderr, "gpucr: GPUCR_TEST_CRASH_AT: %v\n", err)
		return exitUsage
	}
	if err := root.Execute(); err != nil {
		// An error may quote what an image, a store or a neighbour wrote (a lease's host).
		msg := explainInterrupt(printable(oneLine(err)), err, interrupt.Received()) + a.untrustedHint(err)
		code := exitCode(err)
		if job, ok := jobExitCode(err); ok {
			code = job
		} else if isCobraUsage(err) {
			code = exitUsage
			msg = plainCommandError(err)
		}
		fmt.Fprintf(stderr, "gpucr: %s\n", msg)
		var nr notReadyError
		var held inOutput
		if (a.json || askedJSON(args)) && !(errors.As(err, &nr) && nr.reported) && !errors.As(err, &held) {
			// Machines read stdout: the failure is there too, in the same schema.
			b, _ := json.Marshal(errorOutput{Error: msg, ExitCode: code})
			fmt.Fprintf(stdout, "%s\n", b)
		}
		return code
	}
	return 0
}

// rootCmd is gpucr's command line: the global flags and every verb, each verb's
// refusals of a command line made usage errors.
func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpucr",
		Short:         "Checkpoint and restore running GPU processes",
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if a.progressEvery < 0 {
				return usageError{fmt.Errorf("--progress-every %v: give a duration of 0 (never) or more", a.progressEvery)}
			}
			level := slog.LevelWarn
			if a.verbose {
				level = slog.LevelDebug
			}
			a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
			var err error
			a.stopProfile, err = startProfile(a.cpuProfile)
			return err
		},
	}
	root.SetVersionTemplate(fmt.Sprintf("gpucr version {{.Version}}, JSON schema %d\n", jsonSchema))
	pf := root.PersistentFlags()
	pf.BoolVar(&a.json, "json", false, "print results as JSON")
	pf.StringVar(&a.criuPath, "criu", "", "path to the criu binary (default: $GPUCR_CRIU, "+criu.DefaultPrefixBinary+", then PATH)")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "log each step to stderr")
	pf.BoolVarP(&a.quiet, "quiet", "q", false, "show no progress on stderr (errors still go there)")
	pf.DurationVar(&a.progressEvery, "progress-every", 5*time.Second, "when stderr is not a terminal, log a long phase's progress this often (0: never)")
	pf.BoolVar(&a.noTHP, "no-thp", false, "do not switch transparent huge pages to always while GPU memory is staged (it is put back afterwards)")
	pf.StringVar(&a.runDir, "run-dir", txn.DefaultRoot, "where operations are journaled and locked")
	pf.StringVar(&a.thpSwitch, "thp-switch", hosttune.THPPath, "the transparent huge page switch to tune")
	_ = pf.MarkHidden("run-dir")
	_ = pf.MarkHidden("thp-switch")
	pf.StringVar(&a.cpuProfile, "cpu-profile", "", "write a CPU profile of the verb to FILE (go tool pprof)")
	_ = pf.MarkHidden("cpu-profile")
	root.AddCommand(a.recoverCmd(), a.guardCmd(), a.checkCmd(), a.checkpointCmd(), a.restoreCmd(), a.inspectCmd(), a.verifyCmd(), a.runCmd(),
		a.criuActionCmd(), a.installRuncCmd(), a.pushCmd(), a.pullCmd(), a.lsCmd(), a.rmCmd(), a.gcCmd(), a.keygenCmd(), a.signCmd(), a.foldCmd())
	usageErrors(root)
	return root
}

// examples is a verb's Example for --help from its lines, "COMMAND # COMMENT" each: the
// commands indented as cobra shows usage, the comments lined up after the longest command
// that has one.
func examples(lines ...string) string {
	width := 0
	for _, l := range lines {
		if command, _, ok := strings.Cut(l, " # "); ok {
			width = max(width, len(command))
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		command, comment, ok := strings.Cut(l, " # ")
		out[i] = "  " + command
		if ok {
			out[i] += strings.Repeat(" ", width-len(command)+3) + "# " + comment
		}
	}
	return strings.Join(out, "\n")
}

// askedJSON reads --json from a command line that cobra refused before parsing it as far.
func askedJSON(args []string) bool {
	for _, arg := range args {
		if arg == "--" {
			return false
		}
		if v, ok := strings.CutPrefix(arg, "--json="); ok {
			b, err := strconv.ParseBool(v)
			return err == nil && b
		}
		if arg == "--json" {
			return true
		}
	}
	return false
}

// errorOutput is what --json prints on stdout when a verb fails.
type errorOutput struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exitCode"`
}

// usageErrors makes cobra's own refusals of a command line — an unknown flag or verb, a
// wrong number of arguments, a required flag missing — exit 2, as README promises for a
// bad request; cobra returns them as plain errors.
// Each says how the verb is used: "accepts 2 arg(s), received 0" named neither the
// arguments nor where to read about them, and a bad number quoted strconv (UX review).
func usageErrors(root *cobra.Command) {
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%s (see %s --help)", plainFlagError(err), c.CommandPath())}
	})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(c *cobra.Command, a []string) error {
				if err := args(c, a); err != nil {
					return usageError{fmt.Errorf("%w (usage: %s)", err, c.UseLine())}
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// plainFlagError is pflag's refusal of a flag's value without the parser's own words:
// `invalid argument "abc" for "--nproc-per-node" flag: strconv.ParseInt: parsing "abc":
// invalid syntax` says that "abc" is not a number.
func plainFlagError(err error) string {
	msg := err.Error()
	for _, p := range flagParsers {
		if head, _, ok := strings.Cut(msg, p.says); ok {
			return head + ": not " + p.want
		}
	}
	return msg
}

// flagParsers are the parsers' words in pflag's refusals and what the value should have
// been, the first that matches counting: a bool flag's ParseBool, which matched the
// numbers' ": strconv.Parse", told `--json=maybe` it was "not a number", a list of PIDs'
// strconv.Atoi matched nothing and was quoted, and so was a duration without its unit,
// "time: missing unit in duration" (documentation walk).
var flagParsers = []struct{ says, want string }{
	{": strconv.ParseBool", "true or false"},
	{": strconv.", "a number"},
	{": time: ", "a duration (as 90s or 5m)"},
}

// plainCommandError is cobra's refusal of an unknown verb or a missing flag on one line,
// its suggestions as a question ("unknown command "chekpoint" for "gpucr"; ; Did you mean
// this?; checkpoint;" was what one line made of it).
func plainCommandError(err error) string {
	first, rest, _ := strings.Cut(err.Error(), "\n")
	var suggestions []string
	if _, after, ok := strings.Cut(rest, "Did you mean this?"); ok {
		suggestions = strings.Fields(after)
	}
	msg := strings.TrimSpace(first)
	if len(suggestions) > 0 {
		msg += ": did you mean " + strings.Join(suggestions, " or ") + "?"
	}
	return msg + " (see gpucr --help)"
}

// isCobraUsage recognizes the two refusals cobra makes without a hook to type them.
func isCobraUsage(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command ") || strings.HasPrefix(msg, "required flag(s) ")
}

// engine finds CRIU and the GPU backends that work on this host.
func (a *app) engine() (*engine.Engine, error) {
	d, err := criu.Find(a.criuBinary())
	if err != nil {
		return nil, err
	}
	backends, off := gpu.Probe(a.gpuConfig(d.Path))
	for _, o := range off {
		a.log.Debug("GPU backend off", "backend", o.Name, "reason", o.Reason)
	}
	e := &engine.Engine{CRIU: d, Backends: backends, Off: off, Version: versionString(), Log: a.log, Report: a.progress()}
	if !a.noTHP {
		e.THPSwitch = a.thpSwitch
	}
	e.JournalRoot = a.runDir
	e.Guardian = []string{"/proc/self/exe", "guard", "--run-dir", a.runDir}
	return e, nil
}

// progress is the display of long phases on stderr that the engine, push and pull share.
func (a *app) progress() *progress {
	if a.shown == nil {
		a.shownOut = newLossyWriter(a.stderr)
		a.shown = newProgress(a.shownOut, isTerminal(a.stderr), a.progressEvery, a.quiet)
	}
	return a.shown
}

// withEngine checks the CRIU options, builds the engine and runs f under a context that
// SIGINT and SIGTERM cancel; f's error comes back classified for its exit code.
func (a *app) withEngine(cmd *cobra.Command, o criu.Options, f func(context.Context, *engine.Engine) error) error {
	if err := criu.ValidateNetworkLock(o.NetworkLock); err != nil {
		return usageError{err}
	}
	if o.LogLevel < 0 || o.LogLevel > 4 {
		return usageError{fmt.Errorf("--criu-log-level %d: CRIU's levels are 0 to 4 (4 to debug a failure)", o.LogLevel)}
	}
	e, err := a.engine()
	if err != nil {
		return classify(err)
	}
	ctx, stop := interrupt.Context(cmd.Context())
	defer stop()
	return classify(f(ctx, e))
}

// oneLine folds a (possibly joined) error onto one line for the terminal.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
