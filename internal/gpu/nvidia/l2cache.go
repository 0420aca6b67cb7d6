package nvidia

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// l2CacheName is the file, in gpucr's run directory, that keeps the L2 cache sizes CUDA
// reported, for the runs after the first: emptied at boot, written only by root.
const l2CacheName = "nvidia-l2.json"

// l2Cache is the kept L2 sizes, valid for one driver version and the GPUs it lists.
type l2Cache struct{ path string }

type l2Record struct {
	Driver string            `json:"driver"`
	Sizes  map[string]uint64 `json:"sizes"` // by UUID
}

// load returns the kept sizes if they were read under driver and cover every GPU of
// uuids, else nil.
func (c l2Cache) load(driver string, uuids []string) map[string]uint64 {
	b, err := os.ReadFile(c.path)
	if err != nil {
		return nil
	}
	var rec l2Record
	if json.Unmarshal(b, &rec) != nil || rec.Driver != driver {
		return nil
	}
	for _, u := range uuids {
		if rec.Sizes[u] == 0 {
			return nil
		}
	}
	return rec.Sizes
}

// save keeps sizes, read under driver, for the next runs; a run directory that cannot
// take them only costs the next run CUDA's initialization, so errors are dropped.
func (c l2Cache) save(driver string, sizes map[string]uint64) {
	b, err := json.Marshal(l2Record{Driver: driver, Sizes: sizes})
	if err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), l2CacheName+".*")
	if err != nil {
		return
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), c.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
}
