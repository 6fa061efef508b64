//go:build !amd64 || purego

package cpu

// streamRead reads x once (the bandwidth benchmark's loop).
func streamRead(x []byte) uint64 { return streamReadGo(x) }
