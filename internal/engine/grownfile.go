package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criuimg"
)

// HintGrownFile sets, on CRIU's error in err about an open file whose size changed since
// the checkpoint, what to do about it, reading the image's CRIU directory criuDir: a job's
// output sent with > and grown after a --leave-running checkpoint was refused with CRIU's
// "bad size" alone (hostile test). err is CRIU's error as its run returned it: a message
// already wrapped around it does not change. inContainer says the file's name is from a
// container's root.
func HintGrownFile(err error, criuDir string, inContainer bool) {
	var ce *criu.Error
	if !errors.As(err, &ce) || len(ce.Lines) == 0 {
		return
	}
	where := ""
	switch {
	case inContainer:
		where = " in the container"
	case criuimg.OwnMounts(criuDir):
		where = " in the tree's own mount namespace"
	}
	if hint := grownFileHint(ce.Lines[0], criuDir, where); hint != "" {
		ce.Hint = hint // over none: the CRIU run's own (criu.Error) stands where this says nothing
	}
}

// grownFileHint is what to do about CRIU's error line, "" if it is not about a file whose
// size changed, or if the image's files cannot be read. Truncating is offered only for a
// file the job held open write-only (its output) and that grew: one that shrank (rotated,
// truncated by someone) would be padded with zeros, and any other (a program, a library,
// data the job reads or updates) must be put back as it was. where follows the file's name.
func grownFileHint(line, criuDir, where string) string {
	m := criu.GrownFile.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	outputs, err := criuimg.OutputFiles(criuDir)
	if err != nil {
		return ""
	}
	name, was := strings.TrimLeft(m[1], "/"), m[3]
	now, _ := strconv.ParseUint(m[2], 10, 64)
	then, _ := strconv.ParseUint(was, 10, 64)
	if _, ok := outputs[name]; ok && now > then {
		return fmt.Sprintf("the job went on writing it after the checkpoint (%s bytes then), and CRIU restores an open file only as it was; "+
			"truncating it to that size (%s) lets the restore go on, losing what was written since; output appended with >> is not checked",
			was, TruncateCommand("/"+name, then, where))
	}
	return fmt.Sprintf("it is not the file the checkpoint recorded (%s bytes then: a program or library upgraded, or data changed); restore where /%s%s is as it was", was, name, where)
}

// TruncateCommand is the command that truncates the file name to size, for a user to
// paste, or, where name holds a control character, words saying so without the name: the
// job chooses its files' names, and a checkpoint's output line printed one raw, which set
// root's terminal title and printed a line of its own (hostile test); shown with '?' in
// place of each, a pasted command would name, or create, another file. where, when not
// "", says where name is a path (" in the container"): no command is offered then, as one
// pasted on the host truncates the host's file of that name (a container's workload that
// held its own /etc/passwd open for output had root told to run truncate -s 8 /etc/passwd;
// hostile test).
func TruncateCommand(name string, size uint64, where string) string {
	switch {
	case where != "":
		return fmt.Sprintf("to %d bytes%s, not with a command on this host, where that path names another file", size, where)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Sprintf("to %d bytes by hand: its name holds control characters, shown as ?", size)
	}
	return fmt.Sprintf("truncate -s %d %s", size, ShellWord(name))
}

// ShellWord is s as one word of a shell command a user may paste: as it is where it holds
// nothing a shell reads specially, else single-quoted. A file's name comes from the job,
// whose user chooses it: "/home/u/x /etc/shadow" printed bare in a truncate command had root
// truncate /etc/shadow too (hostile test).
func ShellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:@%+=,-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
