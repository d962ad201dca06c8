//go:build race

package api

// raceEnabled: the tests run under the race detector, several times
// slower; the largest measurements shrink.
const raceEnabled = true
