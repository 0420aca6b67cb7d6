package container

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The log stays bounded: past the size it moves aside, and only the newest few old ones stay.
func TestOpenLogRotatesAndKeepsAFew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log", "criu-action.log")
	for i := range 6 {
		f, err := OpenLog(path, 10, 2)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("run " + strconv.Itoa(i) + " of twelve\n") // past 10 bytes: each run rotates the next
		f.Close()
	}
	for name, want := range map[string]string{"": "run 5", ".1": "run 4", ".2": "run 3"} {
		if b, err := os.ReadFile(path + name); err != nil || !strings.HasPrefix(string(b), want) || strings.Count(string(b), "\n") != 1 {
			t.Errorf("%s: %q %v, want one line, %s", path+name, b, err, want)
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third old log kept: %v", err)
	}

	f, _ := OpenLog(path, 1<<20, 2) // under the size: appended to
	f.WriteString("run 6\n")
	f.Close()
	if b, _ := os.ReadFile(path); string(b) != "run 5 of twelve\nrun 6\n" {
		t.Errorf("log under the size: %q", b)
	}
}

// The failure line reaches the stderr of the process that started CRIU.
func TestTellEngineWritesOnTheEnginesStderr(t *testing.T) {
	engineErr := filepath.Join(t.TempDir(), "stderr")
	f, err := os.Create(engineErr)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("engine's own line\n")
	// The engine (sh) starts "CRIU" (sleep) and tells us its PID.
	engine := exec.Command("sh", "-c", "sleep 30 & echo $!; wait")
	engine.Stderr = f
	out, err := engine.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	line, _ := bufio.NewReader(out).ReadString('\n')
	criu, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p, err := os.FindProcess(criu); err == nil {
			p.Kill()
		}
		engine.Wait()
	})
	TellEngine(criu, "gpucr: Error (CRIU action pre-dump): it failed")
	if b, _ := os.ReadFile(engineErr); string(b) != "engine's own line\ngpucr: Error (CRIU action pre-dump): it failed\n" {
		t.Fatalf("the engine's stderr holds %q", b)
	}
}
