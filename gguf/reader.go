// Package gguf reads and writes GGUF files, the model format of llama.cpp:
// versions 2 and 3, every metadata value type, every ggml tensor type, and
// models split over several files.
//
// A File is parsed from its header alone; tensor data is never read until a
// caller asks for it, either as a zero-copy view of a read-only memory map or
// by reading into a buffer. Every count and length in the header is checked
// against the bytes that remain before anything is allocated, so a corrupt
// or hostile file yields an error naming the file and the key or tensor at
// fault, never a panic or a huge allocation.
package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/internal/mmap"
)

// Magic opens every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// KeyAlignment is the metadata key that sets the data alignment.
const KeyAlignment = "general.alignment"

// MaxDims is the most dimensions a tensor may have (GGML_MAX_DIMS).
const MaxDims = 4

// maxAlignment bounds general.alignment; real files use 32 to 4096.
const maxAlignment = 1 << 20

// maxNesting bounds nested arrays so a hostile file cannot recurse deeply.
const maxNesting = 8

// maxNameLen bounds key and tensor name lengths (the spec allows 65535).
const maxNameLen = 65535

// FormatError reports a malformed file: which file, which key or tensor
// (when known), the byte offset, and what was wrong.
type FormatError struct {
	File   string // the file's name as given to the reader
	Where  string // `key "x"`, `tensor "y"`, or "header"
	Offset int64  // byte offset of the fault, -1 if not meaningful
	Msg    string
}

func (e *FormatError) Error() string {
	s := "gguf " + e.File + ": "
	if e.Where != "" {
		s += e.Where + ": "
	}
	s += e.Msg
	if e.Offset >= 0 {
		s += fmt.Sprintf(" (at byte %d)", e.Offset)
	}
	return s
}

// ErrNotGGUF is wrapped by the error for a file without the GGUF magic.
var ErrNotGGUF = errors.New("not a GGUF file")

// KV is one metadata key and its value.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor stored in a file.
type TensorInfo struct {
	Name   string
	Dims   []uint64 // innermost (contiguous) dimension first, as GGUF stores them
	Type   ggml.Type
	Offset uint64 // from the start of the data section; a multiple of the alignment
	Size   uint64 // bytes
}

// Elements returns the number of elements.
func (t *TensorInfo) Elements() uint64 {
	n, _ := ggml.Elements(t.Dims)
	return n
}

// File is one parsed GGUF file.
type File struct {
	Name       string // path or name given when opening
	Version    uint32
	KVs        []KV         // in file order
	Tensors    []TensorInfo // in file order
	Alignment  uint64
	DataOffset int64 // start of the data section
	Size       int64 // file size
	HeaderSize int64 // bytes of header, before the alignment padding

	kvIndex     map[string]int
	tensorIndex map[string]int

	ra     io.ReaderAt // where tensor data is read from when not mapped
	mapped []byte      // whole-file read-only map, or nil
	closer func() error
}

// Options control how a file is opened.
type Options struct {
	// NoMmap reads tensor data into buffers instead of mapping the file.
	NoMmap bool
}

// OpenFile opens and parses one GGUF file. Unless opts.NoMmap, the file is
// mapped read-only and TensorData returns views of the map.
func OpenFile(path string, opts Options) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := osf.Stat()
	if err != nil {
		osf.Close()
		return nil, err
	}
	if st.IsDir() {
		osf.Close()
		return nil, &FormatError{File: path, Offset: -1, Msg: "is a directory"}
	}
	f, err := parse(osf, st.Size(), path)
	if err != nil {
		osf.Close()
		return nil, err
	}
	f.closer = osf.Close
	if !opts.NoMmap && st.Size() > 0 {
		if m, err := mmap.Map(osf, st.Size()); err == nil {
			f.mapped = m
			f.closer = func() error {
				err := mmap.Unmap(m)
				if cerr := osf.Close(); err == nil {
					err = cerr
				}
				return err
			}
		}
	}
	return f, nil
}

// NewFile parses the GGUF header readable from r, a file of the given size.
// Only the header is read; tensor data is read from r on demand.
func NewFile(r io.ReaderAt, size int64, name string) (*File, error) {
	return parse(r, size, name)
}

// Close releases the file and its map. Views returned by TensorData are
// invalid afterwards. Close is idempotent.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	c := f.closer
	f.closer, f.mapped, f.ra = nil, nil, nil
	return c()
}

// Mapped reports whether tensor data is served from a memory map.
func (f *File) Mapped() bool { return f.mapped != nil }

// KV returns the value of a metadata key.
func (f *File) KV(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

// Tensor returns the info of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// TensorData returns the bytes of t. From a mapped file this is a read-only
// view of the map (writing to it faults); otherwise the bytes are read into
// a new buffer.
func (f *File) TensorData(t *TensorInfo) ([]byte, error) {
	start := f.DataOffset + int64(t.Offset)
	if f.mapped != nil {
		return f.mapped[start : start+int64(t.Size) : start+int64(t.Size)], nil
	}
	buf := make([]byte, t.Size)
	if err := f.ReadTensor(t, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// ReadTensor copies the bytes of t into dst, which must be t.Size long.
func (f *File) ReadTensor(t *TensorInfo, dst []byte) error {
	if uint64(len(dst)) != t.Size {
		return fmt.Errorf("gguf %s: tensor %q: buffer of %d bytes, want %d", f.Name, t.Name, len(dst), t.Size)
	}
	if t.Size == 0 {
		return nil
	}
	start := f.DataOffset + int64(t.Offset)
	if f.mapped != nil {
		copy(dst, f.mapped[start:])
		return nil
	}
	if f.ra == nil {
		return fmt.Errorf("gguf %s: file is closed", f.Name)
	}
	if _, err := f.ra.ReadAt(dst, start); err != nil {
		return fmt.Errorf("gguf %s: tensor %q: %w", f.Name, t.Name, err)
	}
	return nil
}

// parser reads the header through r into a growing buffer, never past what
// the header needs by more than one read chunk.
type parser struct {
	name  string
	r     io.ReaderAt
	size  int64
	buf   []byte // bytes [0, len(buf)) of the file
	pos   int
	where string // what is being parsed, for errors
}

const readChunk = 64 << 10

func (p *parser) fail(off int, format string, args ...any) error {
	return &FormatError{File: p.name, Where: p.where, Offset: int64(off), Msg: fmt.Sprintf(format, args...)}
}

// ensure makes n bytes from pos available, or reports truncation.
func (p *parser) ensure(n uint64) error {
	end := uint64(p.pos) + n
	if end > uint64(p.size) {
		return p.fail(p.pos, "truncated: need %d bytes, file has %d left", n, p.size-int64(p.pos))
	}
	if end <= uint64(len(p.buf)) {
		return nil
	}
	want := max(end, uint64(len(p.buf))+readChunk, uint64(len(p.buf))*2)
	want = min(want, uint64(p.size))
	grown := make([]byte, want)
	copy(grown, p.buf)
	if _, err := p.r.ReadAt(grown[len(p.buf):], int64(len(p.buf))); err != nil && err != io.EOF {
		return p.fail(len(p.buf), "read: %v", err)
	}
	p.buf = grown
	return nil
}

func (p *parser) remaining() uint64 { return uint64(p.size) - uint64(p.pos) }

func (p *parser) u32() (uint32, error) {
	if err := p.ensure(4); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(p.buf[p.pos:])
	p.pos += 4
	return v, nil
}

func (p *parser) u64() (uint64, error) {
	if err := p.ensure(8); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(p.buf[p.pos:])
	p.pos += 8
	return v, nil
}

func (p *parser) str(maxLen uint64) (string, error) {
	at := p.pos
	n, err := p.u64()
	if err != nil {
		return "", err
	}
	if n > maxLen {
		return "", p.fail(at, "string length %d exceeds the limit %d", n, maxLen)
	}
	if n > p.remaining() {
		return "", p.fail(at, "string length %d exceeds the %d bytes left in the file", n, p.remaining())
	}
	if err := p.ensure(n); err != nil {
		return "", err
	}
	s := string(p.buf[p.pos : p.pos+int(n)])
	p.pos += int(n)
	return s, nil
}

// skipValue validates a value of type t at pos and moves past it, without
// decoding arrays.
func (p *parser) skipValue(t ValueType, depth int) error {
	at := p.pos
	if sz := t.fixedSize(); sz > 0 {
		return p.advance(uint64(sz))
	}
	switch t {
	case TypeString:
		n, err := p.u64()
		if err != nil {
			return err
		}
		if n > p.remaining() {
			return p.fail(at, "string length %d exceeds the %d bytes left in the file", n, p.remaining())
		}
		return p.advance(n)
	case TypeArray:
		if depth >= maxNesting {
			return p.fail(at, "arrays nested deeper than %d", maxNesting)
		}
		et, err := p.u32()
		if err != nil {
			return err
		}
		elem := ValueType(et)
		if elem > TypeFloat64 {
			return p.fail(at, "array of unknown value type %d", et)
		}
		n, err := p.u64()
		if err != nil {
			return err
		}
		if min := uint64(elem.minSize()); min > 0 && n > p.remaining()/min {
			return p.fail(at, "array of %d %s elements exceeds the %d bytes left in the file", n, elem, p.remaining())
		}
		if sz := elem.fixedSize(); sz > 0 {
			return p.advance(n * uint64(sz))
		}
		for i := uint64(0); i < n; i++ {
			if err := p.skipValue(elem, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return p.fail(at, "unknown value type %d", uint32(t))
}

func (p *parser) advance(n uint64) error {
	if err := p.ensure(n); err != nil {
		return err
	}
	p.pos += int(n)
	return nil
}

func parse(r io.ReaderAt, size int64, name string) (*File, error) {
	p := &parser{name: name, r: r, size: size, where: "header"}
	f := &File{Name: name, Size: size, ra: r, kvIndex: map[string]int{}, tensorIndex: map[string]int{}}

	if size < 4 {
		return nil, fmt.Errorf("gguf %s: %w: file is %d bytes", name, ErrNotGGUF, size)
	}
	if err := p.ensure(4); err != nil {
		return nil, err
	}
	if string(p.buf[:4]) != Magic {
		return nil, fmt.Errorf("gguf %s: %w: magic is %q, want %q", name, ErrNotGGUF, p.buf[:4], Magic)
	}
	p.pos = 4
	version, err := p.u32()
	if err != nil {
		return nil, err
	}
	switch {
	case version == 2 || version == 3:
	case version == 1:
		return nil, p.fail(4, "GGUF version 1 is not supported (only 2 and 3)")
	case bitsSwap32(version) == 2 || bitsSwap32(version) == 3:
		return nil, p.fail(4, "big-endian GGUF is not supported")
	default:
		return nil, p.fail(4, "unsupported GGUF version %d", version)
	}
	f.Version = version

	nTensors, err := p.u64()
	if err != nil {
		return nil, err
	}
	nKV, err := p.u64()
	if err != nil {
		return nil, err
	}
	// The smallest key-value pair is 8 (key length) + 4 (type) + 1 (value)
	// bytes; the smallest tensor info 8 + 4 + 4 + 8.
	if nKV > p.remaining()/13 {
		return nil, p.fail(16, "metadata count %d cannot fit in the %d bytes left in the file", nKV, p.remaining())
	}
	if nTensors > p.remaining()/24 {
		return nil, p.fail(8, "tensor count %d cannot fit in the %d bytes left in the file", nTensors, p.remaining())
	}

	f.KVs = make([]KV, 0, nKV)
	for i := uint64(0); i < nKV; i++ {
		p.where = fmt.Sprintf("metadata entry %d", i)
		key, err := p.str(maxNameLen)
		if err != nil {
			return nil, err
		}
		p.where = fmt.Sprintf("key %q", key)
		if _, dup := f.kvIndex[key]; dup {
			return nil, p.fail(p.pos, "duplicate key")
		}
		tagAt := p.pos
		tag, err := p.u32()
		if err != nil {
			return nil, err
		}
		t := ValueType(tag)
		if t > TypeFloat64 {
			return nil, p.fail(tagAt, "unknown value type %d", tag)
		}
		start := p.pos
		if err := p.skipValue(t, 0); err != nil {
			return nil, err
		}
		v, _ := decodeTrusted(p.buf, start, t)
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}

	f.Alignment = DefaultAlignment
	if v, ok := f.KV(KeyAlignment); ok {
		p.where = fmt.Sprintf("key %q", KeyAlignment)
		a, ok := v.Uint()
		if !ok || a == 0 || a&(a-1) != 0 {
			return nil, p.fail(-1, "alignment %s is not a power of two", v)
		}
		if a > maxAlignment {
			return nil, p.fail(-1, "alignment %d exceeds the limit %d", a, maxAlignment)
		}
		f.Alignment = a
	}

	f.Tensors = make([]TensorInfo, 0, nTensors)
	for i := uint64(0); i < nTensors; i++ {
		p.where = fmt.Sprintf("tensor info %d", i)
		ti, err := p.tensorInfo(f.Alignment)
		if err != nil {
			return nil, err
		}
		if _, dup := f.tensorIndex[ti.Name]; dup {
			return nil, p.fail(p.pos, "duplicate tensor name")
		}
		f.tensorIndex[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	f.HeaderSize = int64(p.pos)
	f.DataOffset = int64(alignUp(uint64(p.pos), f.Alignment))
	if err := checkTensorPlacement(f); err != nil {
		return nil, err
	}
	return f, nil
}

func (p *parser) tensorInfo(align uint64) (TensorInfo, error) {
	var ti TensorInfo
	name, err := p.str(maxNameLen)
	if err != nil {
		return ti, err
	}
	ti.Name = name
	p.where = fmt.Sprintf("tensor %q", name)
	at := p.pos
	nd, err := p.u32()
	if err != nil {
		return ti, err
	}
	if nd > MaxDims {
		return ti, p.fail(at, "%d dimensions, at most %d allowed", nd, MaxDims)
	}
	ti.Dims = make([]uint64, nd)
	for j := range ti.Dims {
		if ti.Dims[j], err = p.u64(); err != nil {
			return ti, err
		}
	}
	at = p.pos
	typ, err := p.u32()
	if err != nil {
		return ti, err
	}
	ti.Type = ggml.Type(typ)
	if !ti.Type.Valid() {
		return ti, p.fail(at, "unknown tensor type id %d", typ)
	}
	at = p.pos
	if ti.Offset, err = p.u64(); err != nil {
		return ti, err
	}
	if ti.Offset%align != 0 {
		return ti, p.fail(at, "data offset %d is not a multiple of the alignment %d", ti.Offset, align)
	}
	size, err := ti.Type.TensorBytes(ti.Dims)
	if err != nil {
		return ti, p.fail(at, "shape %v of type %s: %v", ti.Dims, ti.Type, err)
	}
	ti.Size = size
	return ti, nil
}

// checkTensorPlacement verifies that every tensor lies inside the file and
// that no two overlap.
func checkTensorPlacement(f *File) error {
	if len(f.Tensors) > 0 && f.DataOffset > f.Size {
		return &FormatError{File: f.Name, Where: "header", Offset: -1,
			Msg: fmt.Sprintf("data section would start at byte %d, past the end of the %d-byte file", f.DataOffset, f.Size)}
	}
	dataLen := uint64(0)
	if f.Size > f.DataOffset {
		dataLen = uint64(f.Size - f.DataOffset)
	}
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
		t := &f.Tensors[i]
		if t.Offset > dataLen || t.Size > dataLen-t.Offset {
			return &FormatError{File: f.Name, Where: fmt.Sprintf("tensor %q", t.Name), Offset: -1,
				Msg: fmt.Sprintf("data [%d, +%d) lies outside the file's %d data bytes (file truncated?)", t.Offset, t.Size, dataLen)}
		}
	}
	sort.Slice(order, func(a, b int) bool { return f.Tensors[order[a]].Offset < f.Tensors[order[b]].Offset })
	// Walk in offset order remembering the furthest-reaching non-empty
	// tensor so far; empty tensors occupy nothing and may sit anywhere.
	var last *TensorInfo
	for _, i := range order {
		cur := &f.Tensors[i]
		if cur.Size == 0 {
			continue
		}
		if last != nil && last.Offset+last.Size > cur.Offset {
			return &FormatError{File: f.Name, Where: fmt.Sprintf("tensor %q", cur.Name), Offset: -1,
				Msg: fmt.Sprintf("data at %d overlaps tensor %q at [%d, +%d)", cur.Offset, last.Name, last.Offset, last.Size)}
		}
		if last == nil || cur.Offset+cur.Size > last.Offset+last.Size {
			last = cur
		}
	}
	return nil
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

func bitsSwap32(x uint32) uint32 {
	return x>>24 | (x>>8)&0xff00 | (x<<8)&0xff0000 | x<<24
}
