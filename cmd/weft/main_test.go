package main

import (
	"context"
	"os"
	"testing"
)

// TestMain lets tests run the weft binary as a child process: the test
// binary re-executes itself with WEFT_TEST_MAIN=1 and the command's
// arguments.
func TestMain(m *testing.M) {
	if os.Getenv("WEFT_TEST_MAIN") == "1" {
		os.Exit(runMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
