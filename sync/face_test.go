package sync

import (
	"reflect"
	"testing"
)

// TestEngineFace: what New returns shows the Reader and the lifecycle,
// and no more than 20 methods; what the daemon's faces read besides is
// on the Inspector.
func TestEngineFace(t *testing.T) {
	typ := reflect.TypeFor[*Engine]()
	if n := typ.NumMethod(); n > 20 {
		var names []string
		for i := range n {
			names = append(names, typ.Method(i).Name)
		}
		t.Errorf("*Engine has %d exported methods, want at most 20: %v", n, names)
	}
	if !typ.Implements(reflect.TypeFor[Reader]()) {
		t.Error("*Engine is no Reader")
	}
}
