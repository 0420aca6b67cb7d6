package criu

import (
	"fmt"
	"os"
	"os/user"
	"strings"

	"github.com/gpucr/gpucr/internal/rootonly"
)

// rootOnlyEnv are the variables of CRIU's environment that name what CRIU runs as root,
// and why a path in them must be root's alone: a configuration file read before its first
// step, whose action scripts it runs, and the directory it loads every plugin from.
var rootOnlyEnv = map[string]string{
	"CRIU_CONFIG_FILE": "CRIU runs the action scripts it names as root; unset it, or name a file only root can change",
	"CRIU_LIBS_DIR":    "CRIU loads every plugin in it as root; unset it, or name a directory only root can change",
}

// Environ is gpucr's environment as a CRIU it starts, or a runtime that starts one, is to
// have it. CRIU reads $HOME/.criu/default.conf and $CRIU_CONFIG_FILE before its first step,
// and an action script such a file names runs as root: root's gpucr run in a user's
// environment (sudo -E, a job's) had CRIU run the user's script as root (hostile test); it
// loads the plugins in $CRIU_LIBS_DIR alike, where gpucr names none. So, run as root, CRIU
// gets root's own home, and a CRIU_CONFIG_FILE or CRIU_LIBS_DIR that anyone but root could
// change, or the way to it, is refused.
func Environ() ([]string, error) {
	env := os.Environ()
	if os.Geteuid() != 0 {
		return env, nil
	}
	home := ""
	if u, err := user.LookupId("0"); err == nil {
		home = u.HomeDir
	}
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "HOME" {
			continue
		}
		if why, ok := rootOnlyEnv[k]; ok {
			if v == "" {
				continue // names nothing; left out rather than refused as a path (review)
			}
			if err := rootonly.Strict(v); err != nil {
				return nil, fmt.Errorf("%s %s: %w: %s", k, v, err, why)
			}
		}
		out = append(out, kv)
	}
	if home != "" {
		out = append(out, "HOME="+home)
	}
	return out, nil
}
