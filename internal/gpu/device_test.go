package gpu

import (
	"encoding/json"
	"reflect"
	"testing"
)

// Images of formats 1 and 2 kept a backend's facts as fields of the host and the device;
// they must read as properties, with the numbers' digits exact and processes kept.
func TestSnapshotReadsTheOlderLayout(t *testing.T) {
	old := `{"backend":"nvidia","driverVersion":"580.159.04","cudaVersion":"13.0",
	  "devices":[{"index":0,"uuid":"GPU-a","name":"H100","computeCapability":"9.0","memoryTotalBytes":85899345920,
	    "memoryUsedBytes":1,"pciBusId":"00000000:1A:00.0","numaNode":1,"l2CacheBytes":52428800,"migMode":"disabled","eccMode":"enabled"}],
	  "processes":[{"pid":7,"devices":["GPU-a"],"memoryBytes":5}]}`
	var got Snapshot
	if err := json.Unmarshal([]byte(old), &got); err != nil {
		t.Fatal(err)
	}
	want := Snapshot{
		Host: Host{Backend: "nvidia", DriverVersion: "580.159.04", Properties: Properties{"cudaVersion": "13.0"},
			Devices: []Device{{Index: 0, UUID: "GPU-a", Name: "H100", MemoryTotal: 80 << 30, MemoryUsed: 1, PCIBusID: "00000000:1A:00.0", NUMANode: 1,
				Properties: Properties{"computeCapability": "9.0", "l2CacheBytes": "52428800", "migMode": "disabled", "eccMode": "enabled"}}}},
		Processes: []Process{{PID: 7, Devices: []string{"GPU-a"}, MemoryBytes: 5}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", got, want)
	}
	// Written again, it takes the new layout and reads back the same.
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var again Snapshot
	if err := json.Unmarshal(b, &again); err != nil || !reflect.DeepEqual(again, want) {
		t.Fatalf("round trip: %+v, %v", again, err)
	}
	if err := json.Unmarshal([]byte(`{"index":0,"odd":{"x":1}}`), new(Device)); err == nil {
		t.Fatal("an object where a property belongs must be refused")
	}
}

// The processes holding device files without device state read back as written: a
// snapshot read without them would restore those processes without the plugin that opens
// their files, and CRIU would fail on them.
func TestSnapshotKeepsItsFileHolders(t *testing.T) {
	want := Snapshot{Host: Host{Backend: "nvidia", DriverVersion: "580.159.04", Devices: []Device{}},
		Processes: []Process{{PID: 7, Devices: []string{"GPU-a"}}}, FileHolders: []int{8, 9}}
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got Snapshot
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip of %s: %+v, %v", b, got, err)
	}
	if p := Problem([]Snapshot{{Host: Host{Backend: "nvidia"}, Processes: []Process{{PID: 7}}, FileHolders: []int{7}}}); p == "" {
		t.Fatal("a process both a GPU process and a file holder must be a problem")
	}
}
