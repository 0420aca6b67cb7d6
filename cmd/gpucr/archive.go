package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gpucr/gpucr/internal/archive"
	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/signing"
)

// exportOutput is the archive `checkpoint --export` wrote.
type exportOutput struct {
	File        string              `json:"file"`
	Bytes       int64               `json:"bytes"`
	Compression archive.Compression `json:"compression"`
	Seconds     float64             `json:"seconds"`
}

// exporter is a checkpoint's --export: where the archive goes, and the image directory it
// is packed from, one made beside the archive when -D was not given. Its staging (the
// archive's temporary file, and a directory it made) is journaled: a gpucr killed while it
// packs leaves the partial archive to recovery, and the checkpoint, whose container is gone
// by then, kept and named.
type exporter struct {
	file, dir, runtime string
	temp               bool
	staging            *engine.StagingDir
}

// newExporter checks --export before anything is checkpointed; dir is -D, set to a new
// directory FILE.image-ID beside file when empty.
func newExporter(runDir, file, ctr, to, runc string, dir *string) (*exporter, error) {
	switch {
	case ctr == "":
		return nil, usageError{errors.New("--export needs --container: the archive describes a container")}
	case to != "":
		return nil, usageError{errors.New("--export and --to cannot be combined: export to a file, or store, not both")}
	}
	if err := archive.CheckDest(file); err != nil {
		return nil, usageError{err}
	}
	// Refused before the container is touched: the checkpoint itself went there, and the
	// container was removed before the archive could not be written (tester's report).
	if *dir != "" && within(file, *dir) {
		return nil, usageError{fmt.Errorf("--export %s is the image directory -D %s or inside it: export to a file outside the image", file, *dir)}
	}
	x := &exporter{file: file, dir: *dir, runtime: "runc"}
	if runc != "" {
		x.runtime = filepath.Base(runc)
	}
	var err error
	x.staging, err = engine.NewStagingBeside(runDir, "export of container "+ctr+" to "+file, file)
	if err != nil {
		return nil, classify(err)
	}
	if x.dir != "" {
		return x, nil
	}
	if id := x.staging.ID(); id == "" {
		x.dir, err = os.MkdirTemp(filepath.Dir(file), filepath.Base(file)+".image-*")
	} else {
		x.dir = file + ".image-" + id
		if err = x.staging.Keep(x.dir); err == nil {
			err = os.Mkdir(x.dir, 0o700)
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("stage the checkpoint for %s: %w", file, err), x.staging.Close())
	}
	x.temp, *dir = true, x.dir
	return x, nil
}

// abandon removes the image directory it made for a checkpoint that wrote nothing.
func (x *exporter) abandon() {
	if x == nil {
		return
	}
	if x.temp {
		os.Remove(x.dir) // empty when the checkpoint failed: rmdir is enough, and safe
	}
	_ = x.staging.Close()
}

// write packs the checkpoint m into the archive. An image directory it made is removed
// once the archive is whole, and kept, and named, when it is not.
func (x *exporter) write(ctx context.Context, m *image.Manifest) (*exportOutput, error) {
	start := time.Now()
	e, err := exportOf(x.dir, x.runtime, m)
	var size int64
	if err == nil {
		size, err = archive.Write(ctx, x.file, x.staging.Dir, x.dir, m, e, archive.CompressionFor(x.file))
	}
	if err != nil {
		err = fmt.Errorf("the checkpoint is in %s, but exporting it failed (restore it with gpucr restore --container -D %s): %w", x.dir, x.dir, err)
		return nil, errors.Join(err, x.staging.Close())
	}
	if x.temp {
		if err := x.staging.Discard(x.dir); err != nil {
			return nil, fmt.Errorf("exported to %s, but its staging directory %s is left: %w", x.file, x.dir, err)
		}
	}
	if err := x.staging.Close(); err != nil {
		return nil, fmt.Errorf("exported to %s, but its staging is left for the next gpucr to remove: %w", x.file, err)
	}
	return &exportOutput{File: x.file, Bytes: size, Compression: archive.CompressionFor(x.file), Seconds: time.Since(start).Seconds()}, nil
}

// exportOf is what the archive says of the container in the image at dir: its ID, runtime
// and times (config.dump), and its bundle's OCI spec (spec.dump).
func exportOf(dir, runtime string, m *image.Manifest) (archive.Export, error) {
	info, err := container.ReadInfo(dir)
	if err != nil {
		return archive.Export{}, fmt.Errorf("%s does not hold a container: %w", dir, err)
	}
	specPath := filepath.Join(info.Bundle, "config.json")
	spec, err := container.ReadSpec(info.Bundle)
	if err != nil {
		return archive.Export{}, fmt.Errorf("read the container's OCI spec: %w", err)
	}
	if !json.Valid(spec) {
		return archive.Export{}, fmt.Errorf("the container's OCI spec %s is not JSON", specPath)
	}
	return archive.Export{
		Config: archive.Config{ID: info.ID, Runtime: runtime, Created: info.Created, Checkpointed: m.Created},
		Spec:   spec,
	}, nil
}

func printExport(w io.Writer, out *exportOutput) {
	fmt.Fprintf(w, "  export  %s (%s, %s) in %.2fs\n", out.File, out.Compression, bytesHuman(uint64(out.Bytes)), out.Seconds)
}

// importArchive unpacks the archive at file into dir, verified: restore --import. Its
// staging beside dir, up to the image's size, is journaled: a killed import leaves it to
// the next gpucr's recovery.
func (a *app) importArchive(ctx context.Context, file, dir string, trust signing.Keys) error {
	sd, err := engine.NewStagingBeside(a.runDir, "import of "+file, dir)
	if err != nil {
		return classify(err)
	}
	defer func() { _ = sd.Close() }()
	if _, _, err := archive.Import(ctx, file, dir, sd.Dir, trust); err != nil {
		if errors.Is(err, archive.ErrRefused) || errors.Is(err, image.ErrCorrupt) || errors.Is(err, image.ErrNotEmpty) ||
			errors.Is(err, signing.ErrUntrusted) {
			return usageError{err}
		}
		return err
	}
	return nil
}

// isArchive says whether inspect's argument is a file (an archive), not an image directory.
func isArchive(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// archiveInspect is what inspect says of an archive beside the image it holds.
type archiveInspect struct {
	Compression archive.Compression `json:"compression"`
	Layout      string              `json:"layout"` // "gpucr" (exported by gpucr) or "podman"
	Bytes       int64               `json:"bytes"`  // its files, uncompressed
	Config      *archive.Config     `json:"config,omitempty"`
}

// inspectArchive reads the archive at file in one pass, holding CRIU's metadata in memory:
// nothing is written out.
func inspectArchive(file string) (inspectOutput, error) {
	out := inspectOutput{Dir: file}
	c, err := archive.Read(file)
	if err != nil {
		return out, err
	}
	out.Archive = &archiveInspect{Compression: c.Compression, Layout: "podman", Bytes: c.Bytes, Config: c.Config}
	if out.CRIU, err = criuimg.ReadFS(c.CRIU()); err != nil {
		return out, err
	}
	if out.CRIUStats, err = criuimg.ReadDumpStatsFS(c.Top()); err != nil {
		return out, err
	}
	if !c.Gpucr {
		if b, err := c.File(archive.CheckpointDir + "/descriptors.json"); err == nil {
			if err := json.Unmarshal(b, &out.Descriptors); err != nil {
				return out, fmt.Errorf("read descriptors.json of %s: %w", file, err)
			}
		}
		if b, err := c.File(archive.CheckpointDir + "/" + container.RecordName); err == nil {
			out.GPURecord = &container.Record{}
			if err := json.Unmarshal(b, out.GPURecord); err != nil {
				return out, fmt.Errorf("read %s of %s: %w", container.RecordName, file, err)
			}
		}
		return out, nil
	}
	out.Archive.Layout = "gpucr"
	if out.Manifest, err = c.Manifest(); err != nil {
		return out, err
	}
	if b, err := c.File(archive.GpucrDir + "/" + container.InfoName); err == nil {
		out.Container = &container.Info{}
		if err := json.Unmarshal(b, out.Container); err != nil {
			return out, fmt.Errorf("read %s of %s: %w", container.InfoName, file, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return out, err
	}
	saved, err := memfill.SavedBytes("", out.Manifest)
	if err != nil {
		return out, err
	}
	for i, p := range out.CRIU.Processes {
		out.CRIU.Processes[i].MemoryBytes += uint64(saved[p.PID])
	}
	return out, nil
}

// printArchive prints the archive's lines of inspect; its config.dump only where no
// container.json says more (podman's layout).
func printArchive(w io.Writer, a *archiveInspect, info *container.Info) {
	fmt.Fprintf(w, "archive   %s layout, %s compression, %s of files\n", a.Layout, a.Compression, bytesHuman(uint64(a.Bytes)))
	if c := a.Config; c != nil && info == nil {
		line := "container " + c.ID // written whole: see terminalSafe
		if c.Name != "" {
			line += " (" + c.Name + ")"
		}
		if c.RootfsImageName != "" {
			line += " from " + c.RootfsImageName
		}
		if c.Runtime != "" {
			line += ", runtime " + c.Runtime
		}
		fmt.Fprintln(w, line)
	}
}
