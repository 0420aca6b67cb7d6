package main

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criufold"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu/nvidia"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// foldOutput is what `gpucr fold` wrote.
type foldOutput struct {
	From    string  `json:"from"`
	Dir     string  `json:"dir"`
	Runs    int     `json:"runs"`  // files of mem/ folded into CRIU's page files
	Bytes   int64   `json:"bytes"` // their bytes
	Seconds float64 `json:"seconds"`
}

func (a *app) foldCmd() *cobra.Command {
	var trust trustFlags
	cmd := &cobra.Command{
		Use:   "fold DIR NEWDIR",
		Short: "Copy an image with the memory gpucr saved itself folded into CRIU's page files, so that plain criu restore restores it",
		Example: examples(
			"gpucr fold /ckpt/train-1 /ckpt/train-1-criu # restorable by plain criu restore",
			"gpucr fold /ckpt/train-1 /ckpt/train-1-criu --trust alice.pub # only an image alice signed",
		),
		Long: "fold verifies the image at DIR and writes a new image at NEWDIR (absent or empty) in which the memory\n" +
			"runs gpucr kept in mem/ are in CRIU's own pagemaps and page files: `criu restore -D NEWDIR/criu` alone\n" +
			"then restores the processes with all their memory; processes that held GPU device files without GPU state\n" +
			"(forked DataLoader workers) need gpucr's CRIU plugin loaded too (CRIU_LIBS_DIR, as fold prints). GPU state\n" +
			"is not CRIU's: after a plain CRIU restore it still needs gpucr (or cuda-checkpoint). NEWDIR stays a gpucr\n" +
			"image, restorable by gpucr as well.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := a.trusted(trust)
			if err != nil {
				return err
			}
			m, _, err := image.OpenTrusted(args[0], keys)
			if err != nil {
				return classify(err)
			}
			if err := onlyRootCanChange(args[0], m); err != nil {
				return err
			}
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			start := time.Now()
			sd, err := engine.NewStagingBeside(a.runDir, "fold "+args[0], args[1])
			if err != nil {
				return classify(err)
			}
			defer func() { _ = sd.Close() }()
			res, err := criufold.Fold(ctx, args[0], m, args[1], sd.Dir)
			if outOfRoom(err) {
				err = diskFull("the disk for "+args[1], "free space there or fold onto another disk", "nothing was written", noRoomReason(err), err)
			}
			if err != nil {
				return classify(err)
			}
			out := foldOutput{From: args[0], Dir: args[1], Runs: res.Runs, Bytes: res.Bytes, Seconds: time.Since(start).Seconds()}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "folded %d memory run(s), %s, of %s into CRIU's page files: %s in %.2fs\n",
					out.Runs, bytesHuman(uint64(out.Bytes)), out.From, out.Dir, out.Seconds)
				fmt.Fprintln(a.stdout, "  "+plainRestoreHint(m, out.Dir, a.criuBinary()))
			})
		},
	}
	trust.add(cmd)
	return cmd
}

// plainRestoreHint says how plain CRIU restores the folded image at dir: with gpucr's CRIU
// plugin where processes of it held device files only the plugin carries, and with what
// it leaves to gpucr (GPU state) where it has any. The plugin is looked for beside the CRIU
// gpucr finds for criuPath (--criu or $GPUCR_CRIU, most often unset): looked for beside
// criuPath itself, it was named only where --criu gave a full path.
func plainRestoreHint(m *image.Manifest, dir, criuPath string) string {
	cmd := "criu restore -D " + dir + "/criu"
	state, holders := false, false
	for _, s := range m.GPUs {
		state = state || len(s.Processes) > 0
		holders = holders || len(s.FileHolders) > 0
	}
	if holders {
		criuPath, _ = criu.Locate(criuPath) // "" where there is none: the hint names the plugin's file
		cmd = "CRIU_LIBS_DIR=" + cmp.Or(nvidia.FindFilePlugin(criuPath), "<the directory of gpucr's "+nvidia.FilePluginFile+">") + " " + cmd
	}
	if state {
		return cmd + " restores the CPU side; GPU state still needs gpucr"
	}
	return cmd + " restores it"
}

// onlyRootCanChange refuses, to gpucr running as root, an image that others could change:
// fold reads its files again after verifying them, and a user who swapped one in between
// had root write unverified bytes into the new image, which then verified (a hostile test).
// image.OnlyRootCanChange leaves mem/ to a restore's fill, which hashes what it reads; fold
// copies it, so mem/ and its files are checked here too.
func onlyRootCanChange(dir string, m *image.Manifest) error {
	if os.Geteuid() != 0 {
		return nil
	}
	ok, err := image.OnlyRootCanChange(dir, m.Files)
	if err != nil {
		return err
	}
	mem := []string{criuimg.MemDir}
	for _, f := range m.Files {
		if path.Dir(f.Path) == criuimg.MemDir {
			mem = append(mem, f.Path)
		}
	}
	for _, p := range mem {
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(p)))
		ok = ok && (errors.Is(err, fs.ErrNotExist) || err == nil && rootonly.Mode(p, fi) == nil)
	}
	if !ok {
		return fmt.Errorf("image %s could be changed by others than root while fold reads it: copy it (cp -a) into a directory only root can change and fold the copy", dir)
	}
	return nil
}
