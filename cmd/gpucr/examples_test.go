package main

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Verbs' --help showed no example (UX review). Every verb a user sees has two to four, and
// each is parsed by cobra as gpucr would parse it: the line names that verb, its flags are
// the verb's (or global ones) with values they take, and its arguments are as many as the
// verb accepts, so an example cannot outlive a renamed flag.
func TestEveryVerbHasExamplesThatParse(t *testing.T) {
	for _, verb := range newRoot().Commands() {
		if verb.Hidden || verb.Name() == "help" || verb.Name() == "completion" {
			continue
		}
		lines := exampleLines(verb.Example)
		if len(lines) < 2 || len(lines) > 4 {
			t.Errorf("gpucr %s has %d example lines, want 2 to 4:\n%s", verb.Name(), len(lines), verb.Example)
		}
		for _, line := range lines {
			if err := parseExample(verb.Name(), line); err != nil {
				t.Errorf("gpucr %s --help: example %q: %v", verb.Name(), line, err)
			}
		}
	}
}

// newRoot is a fresh command tree: parsing sets flags, and each example starts from none.
func newRoot() *cobra.Command {
	return (&app{cfg: configFrom(func(string) string { return "" }), stdout: io.Discard, stderr: io.Discard}).rootCmd()
}

// exampleLines are the commands of an Example, one a line, without their comments.
func exampleLines(example string) []string {
	var lines []string
	for line := range strings.Lines(example) {
		line, _, _ = strings.Cut(line, " #")
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// parseExample parses line, a command with optional VAR=value settings before it, as
// gpucr's command line, and says what cobra refuses of it for the verb it must name.
func parseExample(verb, line string) error {
	words := strings.Fields(line)
	for len(words) > 0 && strings.Contains(words[0], "=") {
		words = words[1:]
	}
	if len(words) == 0 || words[0] != "gpucr" {
		return fmt.Errorf("does not run gpucr")
	}
	cmd, args, err := newRoot().Find(words[1:])
	if err != nil {
		return err
	}
	if cmd.Name() != verb {
		return fmt.Errorf("runs gpucr %s", cmd.Name())
	}
	if err := cmd.ParseFlags(args); err != nil {
		return err
	}
	return cmd.ValidateArgs(cmd.Flags().Args())
}
