//go:build race

package main

// raceEnabled: the test builds the program with -race too.
const raceEnabled = true
