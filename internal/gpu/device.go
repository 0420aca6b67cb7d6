package gpu

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Host is the driver and device inventory of one host, as recorded in an image.
type Host struct {
	Backend       string `json:"backend"`
	DriverVersion string `json:"driverVersion"`
	// Properties are the backend's own facts about the host (a CUDA version, say).
	Properties Properties `json:"properties,omitempty"`
	Devices    []Device   `json:"devices"`
}

// Device is one GPU's identity and the properties that restore compatibility checks compare.
type Device struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryTotal uint64 `json:"memoryTotalBytes"`
	MemoryUsed  uint64 `json:"memoryUsedBytes"`
	PCIBusID    string `json:"pciBusId"`
	NUMANode    int    `json:"numaNode"`
	// Properties are what only the backend compares (compute capability, cache sizes,
	// modes), by the names the backend gives them.
	Properties Properties `json:"properties,omitempty"`
}

// Properties are a backend's own facts about a host or device, by name.
type Properties map[string]string

// Uint reads property name as a number; 0 when absent or not a number (unknown).
func (p Properties) Uint(name string) uint64 {
	v, _ := strconv.ParseUint(p[name], 10, 64)
	return v
}

// UnmarshalJSON also reads the layout of image formats 1 and 2, where a backend's own
// facts were fields of the host beside the common ones: each becomes a property.
func (h *Host) UnmarshalJSON(b []byte) error {
	type plain Host
	var v plain
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	legacy, err := legacyProperties(b, "backend", "driverVersion", "properties", "devices", "processes", "deviceFileHolders")
	if err != nil {
		return err
	}
	*h = Host(v)
	h.Properties = merge(h.Properties, legacy)
	return nil
}

// UnmarshalJSON reads the snapshot's host (in either layout, see Host's) and processes:
// without it, the host's method, promoted, would read the whole snapshot.
func (s *Snapshot) UnmarshalJSON(b []byte) error {
	var h Host
	if err := json.Unmarshal(b, &h); err != nil {
		return err
	}
	var p struct {
		Processes   []Process `json:"processes"`
		FileHolders []int     `json:"deviceFileHolders"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	s.Host, s.Processes, s.FileHolders = h, p.Processes, p.FileHolders
	return nil
}

// UnmarshalJSON reads both layouts, as Host's does.
func (d *Device) UnmarshalJSON(b []byte) error {
	type plain Device
	var v plain
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	legacy, err := legacyProperties(b, "index", "uuid", "name", "memoryTotalBytes", "memoryUsedBytes", "pciBusId", "numaNode", "properties")
	if err != nil {
		return err
	}
	*d = Device(v)
	d.Properties = merge(d.Properties, legacy)
	return nil
}

// legacyProperties returns the scalar fields of the JSON object b other than known, as
// strings: the backend facts an older image kept beside the common fields.
func legacyProperties(b []byte, known ...string) (Properties, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, err
	}
	for _, k := range known {
		delete(fields, k)
	}
	var out Properties
	for k, raw := range fields {
		var s string
		switch t := strings.TrimSpace(string(raw)); {
		case strings.HasPrefix(t, `"`):
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, err
			}
		case t == "true" || t == "false" || json.Valid(raw) && strings.Trim(t, "-0123456789.eE+") == "":
			s = t // a number keeps its exact digits
		default:
			return nil, fmt.Errorf("GPU property %q: want a string, number or boolean", k)
		}
		if out == nil {
			out = Properties{}
		}
		out[k] = s
	}
	return out, nil
}

func merge(p, legacy Properties) Properties {
	if len(legacy) == 0 {
		return p
	}
	if p == nil {
		p = Properties{}
	}
	for k, v := range legacy {
		if _, ok := p[k]; !ok {
			p[k] = v
		}
	}
	return p
}
