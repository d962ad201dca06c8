//go:build race

package server

// raceEnabled: the tests run under the race detector, several times
// slower; the largest measurements shrink.
const raceEnabled = true
