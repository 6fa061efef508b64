package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"sort"

	"github.com/weftlm/weft/ggml"
)

// Writer builds a GGUF file: metadata in insertion order, tensor infos in
// insertion order, tensor data at aligned offsets with zero padding. A file
// read by this package and copied with Rewrite is reproduced byte for byte
// (padding included, as long as the original's padding was zeros).
type Writer struct {
	Version uint32 // 3 unless set
	// Size, when larger than what the tensors need, pads the file with
	// zeros to that many bytes (Rewrite sets it to reproduce files that end
	// in more padding than the last tensor needs).
	Size int64

	kvs     []KV
	kvIndex map[string]int
	tensors []writerTensor
	names   map[string]bool
	end     uint64 // end of the last tensor's data, relative to the data section
}

type writerTensor struct {
	info TensorInfo
	data []byte
	fill func(io.Writer) error // writes the data when data is nil
}

// NewWriter returns an empty GGUF v3 writer.
func NewWriter() *Writer {
	return &Writer{Version: 3, kvIndex: map[string]int{}, names: map[string]bool{}}
}

// SetKV sets a metadata value, keeping the key's first position.
func (w *Writer) SetKV(key string, v Value) {
	if i, ok := w.kvIndex[key]; ok {
		w.kvs[i].Value = v
		return
	}
	w.kvIndex[key] = len(w.kvs)
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
}

func (w *Writer) alignment() uint64 {
	if i, ok := w.kvIndex[KeyAlignment]; ok {
		if a, ok := w.kvs[i].Value.Uint(); ok && a > 0 && a&(a-1) == 0 {
			return a
		}
	}
	return DefaultAlignment
}

// AddTensor appends a tensor; its data is placed after the previous tensor's
// at the next aligned offset. Set general.alignment before adding tensors.
func (w *Writer) AddTensor(name string, typ ggml.Type, dims []uint64, data []byte) error {
	return w.addTensorAt(name, typ, dims, alignUp(w.end, w.alignment()), data)
}

// AddTensorFunc appends a tensor whose data fill writes when the file is
// written, so a large file can be produced one tensor at a time. fill must
// write exactly the tensor's byte size.
func (w *Writer) AddTensorFunc(name string, typ ggml.Type, dims []uint64, fill func(io.Writer) error) error {
	size, err := typ.TensorBytes(dims)
	if err != nil {
		return fmt.Errorf("gguf writer: tensor %q: %w", name, err)
	}
	if err := w.addTensorAt(name, typ, dims, alignUp(w.end, w.alignment()), nil, size); err != nil {
		return err
	}
	w.tensors[len(w.tensors)-1].fill = fill
	return nil
}

func (w *Writer) addTensorAt(name string, typ ggml.Type, dims []uint64, offset uint64, data []byte, dataSize ...uint64) error {
	if w.names[name] {
		return fmt.Errorf("gguf writer: duplicate tensor %q", name)
	}
	if len(dims) > MaxDims {
		return fmt.Errorf("gguf writer: tensor %q has %d dimensions, at most %d allowed", name, len(dims), MaxDims)
	}
	size, err := typ.TensorBytes(dims)
	if err != nil {
		return fmt.Errorf("gguf writer: tensor %q: %w", name, err)
	}
	if uint64(len(data)) != size && (data != nil || len(dataSize) == 0 || dataSize[0] != size) {
		return fmt.Errorf("gguf writer: tensor %q: %d bytes of data, %s %v needs %d", name, len(data), typ, dims, size)
	}
	if offset%w.alignment() != 0 {
		return fmt.Errorf("gguf writer: tensor %q: offset %d is not aligned to %d", name, offset, w.alignment())
	}
	w.names[name] = true
	w.tensors = append(w.tensors, writerTensor{
		info: TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: typ, Offset: offset, Size: size},
		data: data,
	})
	w.end = max(w.end, offset+size)
	return nil
}

// WriteTo writes the file.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(out, 1<<20)
	le := binary.LittleEndian
	var hdr []byte
	hdr = append(hdr, Magic...)
	hdr = le.AppendUint32(hdr, w.Version)
	hdr = le.AppendUint64(hdr, uint64(len(w.tensors)))
	hdr = le.AppendUint64(hdr, uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		hdr = le.AppendUint64(hdr, uint64(len(kv.Key)))
		hdr = append(hdr, kv.Key...)
		hdr = appendValue(hdr, kv.Value, true)
	}
	for _, t := range w.tensors {
		hdr = le.AppendUint64(hdr, uint64(len(t.info.Name)))
		hdr = append(hdr, t.info.Name...)
		hdr = le.AppendUint32(hdr, uint32(len(t.info.Dims)))
		for _, d := range t.info.Dims {
			hdr = le.AppendUint64(hdr, d)
		}
		hdr = le.AppendUint32(hdr, uint32(t.info.Type))
		hdr = le.AppendUint64(hdr, t.info.Offset)
	}
	align := w.alignment()
	dataStart := alignUp(uint64(len(hdr)), align)
	var n int64
	write := func(b []byte) error {
		m, err := bw.Write(b)
		n += int64(m)
		return err
	}
	if err := write(hdr); err != nil {
		return n, err
	}
	order := make([]int, len(w.tensors))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return w.tensors[order[a]].info.Offset < w.tensors[order[b]].info.Offset })
	pos := uint64(0) // relative to the data section
	zeros := make([]byte, 64<<10)
	pad := func(to uint64) error {
		for pos < to {
			k := min(to-pos, uint64(len(zeros)))
			if err := write(zeros[:k]); err != nil {
				return err
			}
			pos += k
		}
		return nil
	}
	if len(w.tensors) == 0 {
		// A file without tensors ends with its header (as llama.cpp writes
		// vocab-only files), unless Size asks for more.
		for int64(len(hdr))+int64(pos) < w.Size {
			k := min(uint64(w.Size)-uint64(len(hdr))-pos, uint64(len(zeros)))
			if err := write(zeros[:k]); err != nil {
				return n, err
			}
			pos += k
		}
		return n, bw.Flush()
	}
	for k := dataStart - uint64(len(hdr)); k > 0; {
		c := min(k, uint64(len(zeros)))
		if err := write(zeros[:c]); err != nil {
			return n, err
		}
		k -= c
	}
	for _, i := range order {
		t := w.tensors[i]
		if t.info.Size == 0 {
			continue // no bytes: any offset within the data section will do
		}
		if t.info.Offset < pos {
			return n, fmt.Errorf("gguf writer: tensor %q at %d overlaps the previous tensor", t.info.Name, t.info.Offset)
		}
		if err := pad(t.info.Offset); err != nil {
			return n, err
		}
		if t.fill != nil {
			cw := &countingWriter{w: bw}
			if err := t.fill(cw); err != nil {
				return n + cw.n, fmt.Errorf("gguf writer: tensor %q: %w", t.info.Name, err)
			}
			n += cw.n
			if uint64(cw.n) != t.info.Size {
				return n, fmt.Errorf("gguf writer: tensor %q: wrote %d bytes, want %d", t.info.Name, cw.n, t.info.Size)
			}
			pos += t.info.Size
			continue
		}
		if err := write(t.data); err != nil {
			return n, err
		}
		pos += uint64(len(t.data))
	}
	end := alignUp(pos, align)
	if w.Size > int64(dataStart+end) {
		end = uint64(w.Size) - dataStart
	}
	if err := pad(end); err != nil {
		return n, err
	}
	return n, bw.Flush()
}

// Rewrite returns a Writer holding f's metadata and tensors at their
// original offsets; writing it reproduces f.
func Rewrite(f *File) (*Writer, error) {
	w := NewWriter()
	w.Version = f.Version
	for _, kv := range f.KVs {
		w.SetKV(kv.Key, kv.Value)
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		data, err := f.TensorData(t)
		if err != nil {
			return nil, err
		}
		if err := w.addTensorAt(t.Name, t.Type, t.Dims, t.Offset, data); err != nil {
			return nil, err
		}
	}
	w.Size = f.Size
	return w, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	m, err := c.w.Write(p)
	c.n += int64(m)
	return m, err
}
