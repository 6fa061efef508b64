//go:build !unix

// Package mmap maps files read-only into memory.
package mmap

import (
	"errors"
	"os"
)

// Map is unsupported on this platform; callers fall back to reading.
func Map(*os.File, int64) ([]byte, error) {
	return nil, errors.New("mmap unsupported on this platform")
}

// Unmap does nothing here.
func Unmap([]byte) error { return nil }
