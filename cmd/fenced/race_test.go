//go:build race

package main_test

// raceEnabled: the tests run with -race, so the binary is built with it.
const raceEnabled = true
