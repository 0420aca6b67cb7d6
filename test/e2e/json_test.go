package e2e

import (
	"slices"

	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/txn"
)

// The --json documents of docs/json.md, as a script reads them: declared here, field by
// field from the document rather than taken from the CLI's own types, so that a renamed
// or dropped field fails these tests as it would break a script. Only the fields the tests
// look at are declared. What gpucr embeds from other formats (the image manifest, CRIU's
// summary and statistics, journal entries) is read with the types that own those formats.

type checkpointDoc struct {
	Dir          string             `json:"dir"`
	SignedBy     string             `json:"signedBy"`
	RootPID      int                `json:"rootPid"`
	ContainerPID int                `json:"containerPid"`
	Processes    int                `json:"processes"`
	MemoryBytes  uint64             `json:"memoryBytes"`
	Phases       []phase            `json:"phases"`
	Streamed     bool               `json:"streamed"`
	Pushed       *transferDoc       `json:"pushed"`
	CRIUStats    *criuimg.DumpStats `json:"criuDumpStats"`
	Exported     *struct {
		File        string `json:"file"`
		Compression string `json:"compression"`
	} `json:"exported"`
}

type restoreDoc struct {
	Dir          string                `json:"dir"`
	RootPID      int                   `json:"rootPid"`
	ContainerPID int                   `json:"containerPid"`
	SignedBy     string                `json:"signedBy"`
	Phases       []phase               `json:"phases"`
	Pulled       *transferDoc          `json:"pulled"`
	Streamed     *streamDoc            `json:"streamed"`
	CRIUStats    *criuimg.RestoreStats `json:"criuRestoreStats"`
}

type phase struct {
	Name string `json:"name"`
}

func hasPhase(ps []phase, name string) bool {
	return slices.ContainsFunc(ps, func(p phase) bool { return p.Name == name })
}

// transferDoc is push's and pull's document, and checkpoint's pushed and restore's pulled.
type transferDoc struct {
	URL              string  `json:"url"`
	Bytes            int64   `json:"bytes"`
	ZeroBytes        int64   `json:"zeroBytes"`
	Chunks           int     `json:"chunks"`
	TransferredBytes int64   `json:"transferredBytes"`
	WireBytes        int64   `json:"wireBytes"`
	PresentChunks    int     `json:"presentChunks"`
	Seconds          float64 `json:"seconds"`
}

// streamDoc is restore's streamed: a restore --from without -D.
type streamDoc struct {
	FetchedBytes int64 `json:"fetchedBytes"`
	LocalBound   int64 `json:"localBoundBytes"`
	MemoryBytes  int64 `json:"memoryBytes"`
	Chunks       int   `json:"chunks"`
}

type inspectDoc struct {
	Manifest  *image.Manifest    `json:"manifest"`
	Container *container.Info    `json:"container"`
	CRIU      *criuimg.Summary   `json:"criu"`
	CRIUStats *criuimg.DumpStats `json:"criuDumpStats"`
	Archive   *struct {
		Layout      string `json:"layout"`
		Compression string `json:"compression"`
	} `json:"archive"`
}

type lsDoc struct {
	URL         string `json:"url"`
	Host        string `json:"host"`
	RootPID     int    `json:"rootPid"`
	Processes   int    `json:"processes"`
	MemoryBytes uint64 `json:"memoryBytes"`
	StoredBytes int64  `json:"storedBytes"`
}

// collectDoc is gc's and rm's document.
type collectDoc struct {
	Deleted       string `json:"deleted"`
	Checkpoints   int    `json:"checkpoints"`
	KeptChunks    int    `json:"keptChunks"`
	RemovedChunks int    `json:"removedChunks"`
}

type checkDoc struct {
	Ready bool `json:"ready"`
	CRIU  struct {
		OK bool `json:"ok"`
	} `json:"criu"`
	Operations []txn.Entry `json:"operations"`
	Stranded   []int       `json:"strandedGpuProcesses"`
}

type verifyDoc struct {
	SignedBy string `json:"signedBy"`
}

type keygenDoc struct {
	KeyID string `json:"keyId"`
}

type foldDoc struct {
	Runs  int   `json:"runs"`
	Bytes int64 `json:"bytes"`
}

// errorDoc is what a failing verb prints on stdout under --json.
type errorDoc struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exitCode"`
}
