package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criuimg"
)

// ExplainGrownFile gives a restore's CRIU error about an open file whose size changed since
// the checkpoint what to do, reading the image's CRIU directory criuDir: a job's output sent
// with > and grown after a --leave-running checkpoint was refused with CRIU's "bad size"
// alone (hostile test). Truncating is offered only for a file the job held open
// write-only (its output); any other (a program, a library, data it reads or updates) must
// be put back as it was.
// inContainer says the file's name is from a container's root. err is CRIU's error as its
// run returned it: a message already wrapped around it does not change.
func ExplainGrownFile(err error, criuDir string, inContainer bool) {
	var ce *criu.Error
	if !errors.As(err, &ce) || len(ce.Lines) == 0 {
		return
	}
	m := criu.GrownFile.FindStringSubmatch(ce.Lines[0])
	if m == nil {
		return
	}
	name, was := strings.TrimLeft(m[1], "/"), m[3]
	where := ""
	if inContainer {
		where = " in the container"
	}
	outputs, werr := criuimg.OutputFiles(criuDir)
	if _, ok := outputs[name]; werr == nil && ok {
		ce.Hint = fmt.Sprintf("the job went on writing it after the checkpoint (%s bytes then), and CRIU restores an open file only as it was; "+
			"truncating it to that size (truncate -s %s /%s%s) lets the restore go on, losing what was written since; output appended with >> is not checked",
			was, was, name, where)
		return
	}
	ce.Hint = fmt.Sprintf("it is not the file the checkpoint recorded (%s bytes then: a program or library upgraded, or data changed); restore where /%s%s is as it was", was, name, where)
}
