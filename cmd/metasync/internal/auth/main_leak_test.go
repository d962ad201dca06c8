package auth

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines they started are
// still running once they end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
