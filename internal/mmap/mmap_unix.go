//go:build unix

// Package mmap maps files read-only into memory.
package mmap

import (
	"os"
	"syscall"
)

// Map maps the first size bytes of f read-only.
func Map(f *os.File, size int64) ([]byte, error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, syscall.EINVAL
	}
	return syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

// Unmap releases a map made by Map.
func Unmap(b []byte) error { return syscall.Munmap(b) }
