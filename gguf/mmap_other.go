//go:build !unix

package gguf

import (
	"errors"
	"os"
)

// Without mmap, tensor data is read into buffers.
func mmapFile(*os.File, int64) ([]byte, error) { return nil, errors.New("mmap unsupported") }

func munmap([]byte) error { return nil }
