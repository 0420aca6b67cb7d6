package hwbreak

import "testing"

// The check finds its program without PATH too, as a gpucr a runtime's hook starts may have
// none.
func TestTraceableWithoutPath(t *testing.T) {
	t.Setenv("PATH", "")
	if _, err := traceable(); err != nil {
		t.Fatal(err)
	}
}
