package gpu

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// Two vendors may name a check alike: the flag switches off both, each variable only its own.
func TestSkipsFromSeparatesVendors(t *testing.T) {
	vendors := []Vendor{
		{Name: "a", Checks: []Check{{Name: "numa", Env: "A_NUMA_CHECK"}, {Name: "model"}}},
		{Name: "b", Checks: []Check{{Name: "numa", Env: "B_NUMA_CHECK"}, {Name: "fw", Env: "B_FW_CHECK"}}},
	}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cases := []struct {
		name    string
		flags   []string
		env     map[string]string
		want    Skips
		wantErr string
	}{
		{"flag reaches every vendor with the check", []string{"numa"}, nil, Skips{"a": {"numa": true}, "b": {"numa": true}}, ""},
		{"variable reaches its own vendor", nil, map[string]string{"B_NUMA_CHECK": "no"}, Skips{"b": {"numa": true}}, ""},
		{"1, yes and empty keep the check", nil, map[string]string{"A_NUMA_CHECK": "1", "B_NUMA_CHECK": "YES", "B_FW_CHECK": ""}, Skips{}, ""},
		{"a typo in a variable is an error", nil, map[string]string{"B_FW_CHECK": "off"}, nil, `B_FW_CHECK="off": want 0 or no`},
		{"a check that cannot be switched off is unknown to the flag", []string{"model"}, nil, nil, `unknown check "model" for --skip-check; the checks are numa, fw`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := SkipsFrom(vendors, c.flags, env(c.env))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("SkipsFrom = %v, %v; want %v", got, err, c.want)
			}
		})
	}
	if s := (Skips{}); s.For("a") == nil || s.For("a")["numa"] {
		t.Fatal("For of an empty Skips must be an empty, usable set")
	}
}

func TestIncompatibleErrorSaysHowToSkip(t *testing.T) {
	on := Incompatible(Check{Name: "fw", Env: "B_FW_CHECK"}, "GPU 1", "firmware older", "5", "4")
	if want := "GPU 1: firmware older: image 5, host 4 (skip with --skip-check fw or B_FW_CHECK=0)"; on.Error() != want {
		t.Errorf("got %q, want %q", on.Error(), want)
	}
	fixed := Incompatible(Check{Name: "model"}, "GPU 1", "model differs", "x", "y")
	if !strings.HasSuffix(fixed.Error(), "(this check cannot be switched off)") || !errors.Is(fixed, ErrIncompatible) {
		t.Errorf("got %q", fixed.Error())
	}
}
