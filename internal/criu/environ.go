package criu

import (
	"fmt"
	"os"
	"os/user"
	"strings"

	"github.com/gpucr/gpucr/internal/rootonly"
)

// configEnv names a configuration file CRIU reads, beside $HOME/.criu/default.conf, before
// its first step.
const configEnv = "CRIU_CONFIG_FILE"

// Environ is gpucr's environment as a CRIU it starts, or a runtime that starts one, is to
// have it. CRIU reads $HOME/.criu/default.conf and $CRIU_CONFIG_FILE before its first step,
// and an action script such a file names runs as root: root's gpucr run in a user's
// environment (sudo -E, a job's) had CRIU run the user's script as root (hostile test). So,
// run as root, CRIU gets root's own home, and a CRIU_CONFIG_FILE that anyone but root could
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
		switch k {
		case "HOME":
			continue
		case configEnv:
			if err := rootonly.Strict(v); err != nil {
				return nil, fmt.Errorf("%s %s: %w: CRIU runs the action scripts it names as root; unset it, or name a file only root can change", configEnv, v, err)
			}
		}
		out = append(out, kv)
	}
	if home != "" {
		out = append(out, "HOME="+home)
	}
	return out, nil
}
