// Package safetensors reads and writes safetensors files, the tensor format
// of Hugging Face and MLX checkpoints, and opens models sharded over several
// files in one directory.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON, then the tensor data. The JSON maps each tensor name to its dtype,
// shape (outermost dimension first) and data_offsets [begin, end), counted
// from the first byte after the header; the optional "__metadata__" entry
// maps strings to strings.
//
// A File is parsed from its header alone; tensor data is never read until a
// caller asks for it, either as a zero-copy view of a read-only memory map or
// by reading into a buffer. The header length is checked against a limit and
// the file size before anything is allocated, and every tensor's shape,
// dtype and placement are checked, so a corrupt or hostile file yields an
// error naming the file and the tensor or field at fault, never a panic or a
// huge allocation. A key given twice in any JSON object is an error too,
// since encoding/json would silently keep the last.
//
// The reader is a little more lenient than the reference implementation
// where nothing is ambiguous: it accepts gaps between tensors and bytes after
// the last one, skips unknown fields in a tensor entry, and reads a null
// "__metadata__" as none. Overlapping tensors are refused.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"unicode/utf8"

	"github.com/weftlm/weft/internal/mmap"
)

// MaxHeaderSize bounds the JSON header, as the reference implementation
// does (100 MB there; 100 MiB here).
const MaxHeaderSize = 100 << 20

// MetadataKey is the header entry that holds string metadata, not a tensor.
const MetadataKey = "__metadata__"

// firstRead is how much NewFile reads at offset 0 in one call: the length
// field and, for most files, the whole header. A longer header is read with
// one more call, so NewFile reads nothing outside [0, max(8+N, firstRead)).
const firstRead = 64 << 10

// FormatError reports a malformed file: which file, which tensor or field
// (when known), and what was wrong.
type FormatError struct {
	File  string // the file's name as given to the reader
	Where string // `tensor "x"`, `__metadata__ key "k"`, or "header"
	Msg   string
}

func (e *FormatError) Error() string {
	s := "safetensors " + e.File + ": "
	if e.Where != "" {
		s += e.Where + ": "
	}
	return s + e.Msg
}

// TensorInfo describes one tensor stored in a file.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64 // outermost dimension first, as safetensors stores them; empty for a scalar
	// Begin and End delimit the tensor's bytes relative to the start of the
	// data section (File.DataOffset), exactly as data_offsets in the header.
	Begin, End int64
}

// Size returns the tensor's length in bytes.
func (t *TensorInfo) Size() int64 { return t.End - t.Begin }

// Elements returns the number of elements (1 for a scalar).
func (t *TensorInfo) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is one parsed safetensors file. Its methods may be called from
// several goroutines at once, except Close.
type File struct {
	Name       string // path or name given when opening
	Size       int64  // file size in bytes
	HeaderSize int64  // N, the JSON header's length
	DataOffset int64  // 8 + N: where data_offsets count from

	tensors  []TensorInfo // sorted by Begin, then name
	index    map[string]int
	metadata map[string]string

	ra     io.ReaderAt // where tensor data is read from when not mapped
	mapped []byte      // whole-file read-only map, or nil
	closer func() error
	closed bool
}

// Options control how a file is opened.
type Options struct {
	// NoMmap reads tensor data into buffers instead of mapping the file.
	NoMmap bool
}

// OpenFile opens and parses one safetensors file. Unless opts.NoMmap, the
// file is mapped read-only and TensorData returns views of the map.
func OpenFile(path string, opts Options) (*File, error) {
	osf, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in our prefix
		}
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	f, err := openOS(osf, path, opts)
	if err != nil {
		osf.Close()
		return nil, err
	}
	return f, nil
}

// openOS parses an open file and takes ownership of it on success.
func openOS(osf *os.File, name string, opts Options) (*File, error) {
	st, err := osf.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", name, err)
	}
	if st.IsDir() {
		return nil, &FormatError{File: name, Msg: "is a directory"}
	}
	f, err := parse(osf, st.Size(), name)
	if err != nil {
		return nil, err
	}
	f.closer = osf.Close
	if !opts.NoMmap {
		// A failed map (an unsupported platform, a special file) is not an
		// error: the file is still readable through ReadAt.
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

// NewFile parses the safetensors header readable from r, a file of the given
// size. Only the header is read (see firstRead); tensor data is read from r
// on demand. Close does not close r.
func NewFile(r io.ReaderAt, size int64, name string) (*File, error) {
	return parse(r, size, name)
}

// Close releases the file and its map. Views returned by TensorData are
// invalid afterwards, and later reads fail. Close is idempotent.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	c := f.closer
	f.closer, f.mapped, f.ra = nil, nil, nil
	if c == nil {
		return nil
	}
	return c()
}

// Mapped reports whether tensor data is served from a memory map.
func (f *File) Mapped() bool { return f.mapped != nil }

// Tensors returns every tensor, sorted by data offset (ties by name). The
// slice is the File's own; callers must not modify it.
func (f *File) Tensors() []TensorInfo { return f.tensors }

// Tensor returns the info of the named tensor.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.index[name]
	if !ok {
		return nil, false
	}
	return &f.tensors[i], true
}

// Metadata returns the "__metadata__" entries (empty, never nil, when the
// header has none). The map is the File's own; callers must not modify it.
func (f *File) Metadata() map[string]string { return f.metadata }

// TensorData returns the bytes of t. From a mapped file this is a read-only
// view of the map (writing to it faults) valid until Close; otherwise the
// bytes are read into a new buffer.
func (f *File) TensorData(t *TensorInfo) ([]byte, error) {
	if err := f.check(t); err != nil {
		return nil, err
	}
	if f.mapped != nil {
		start, end := f.DataOffset+t.Begin, f.DataOffset+t.End
		return f.mapped[start:end:end], nil
	}
	buf := make([]byte, t.Size())
	if err := f.ReadTensor(t, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// ReadTensor copies the bytes of t into dst, which must be t.Size() long.
func (f *File) ReadTensor(t *TensorInfo, dst []byte) error {
	if err := f.check(t); err != nil {
		return err
	}
	if int64(len(dst)) != t.Size() {
		return fmt.Errorf("safetensors %s: tensor %q: buffer of %d bytes, want %d", f.Name, t.Name, len(dst), t.Size())
	}
	start := f.DataOffset + t.Begin
	if f.mapped != nil {
		copy(dst, f.mapped[start:])
		return nil
	}
	if n, err := f.ra.ReadAt(dst, start); n != len(dst) {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("safetensors %s: tensor %q: %w", f.Name, t.Name, err)
	}
	return nil
}

// check rejects reads from a closed file and infos that are not this
// file's (a TensorInfo from another shard would read the wrong bytes).
func (f *File) check(t *TensorInfo) error {
	if f.closed {
		return fmt.Errorf("safetensors %s: file is closed", f.Name)
	}
	if own, ok := f.Tensor(t.Name); !ok || own.Begin != t.Begin || own.End != t.End {
		return fmt.Errorf("safetensors %s: tensor %q is not one of this file's", f.Name, t.Name)
	}
	return nil
}

// readAt fills buf from off, treating a short read as an error.
func readAt(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func parse(r io.ReaderAt, size int64, name string) (*File, error) {
	fail := func(format string, args ...any) error {
		return &FormatError{File: name, Where: "header", Msg: fmt.Sprintf(format, args...)}
	}
	if size < 8 {
		return nil, fail("file is %d bytes, too short for the 8-byte header length", size)
	}
	first := make([]byte, min(size, firstRead))
	if err := readAt(r, first, 0); err != nil {
		return nil, fail("reading: %v", err)
	}
	n := binary.LittleEndian.Uint64(first)
	if n > MaxHeaderSize {
		return nil, fail("header length %d exceeds the limit of %d bytes", n, MaxHeaderSize)
	}
	if n > uint64(size-8) {
		return nil, fail("header length %d exceeds the %d bytes after the length field (file truncated?)", n, size-8)
	}
	var header []byte
	if end := 8 + int64(n); end <= int64(len(first)) {
		header = first[8:end]
	} else {
		header = make([]byte, n)
		copied := copy(header, first[8:])
		if err := readAt(r, header[copied:], int64(len(first))); err != nil {
			return nil, fail("reading: %v", err)
		}
	}
	if !utf8.Valid(header) {
		return nil, fail("JSON is not valid UTF-8")
	}
	f := &File{Name: name, Size: size, HeaderSize: int64(n), DataOffset: 8 + int64(n), ra: r}
	if err := f.parseHeader(header); err != nil {
		return nil, err
	}
	if err := f.checkPlacement(); err != nil {
		return nil, err
	}
	return f, nil
}

// parseHeader walks the JSON object of tensor entries and metadata.
func (f *File) parseHeader(header []byte) error {
	fail := func(where string, err error) error {
		return &FormatError{File: f.Name, Where: where, Msg: err.Error()}
	}
	w := newWalker(header)
	if err := w.object(); err != nil {
		return fail("header", err)
	}
	f.index = map[string]int{}
	f.metadata = map[string]string{}
	seen := map[string]bool{}
	for {
		key, done, err := w.key(seen)
		if errors.Is(err, errDuplicate) {
			if key == MetadataKey {
				return fail(MetadataKey, err)
			}
			return fail(fmt.Sprintf("tensor %q", key), err)
		}
		if err != nil {
			return fail("header", err)
		}
		if done {
			break
		}
		if key == MetadataKey {
			if err := f.parseMetadata(w); err != nil {
				return err
			}
			continue
		}
		t, err := parseEntry(w, key)
		if err != nil {
			return fail(fmt.Sprintf("tensor %q", key), err)
		}
		f.tensors = append(f.tensors, t)
	}
	if err := w.end(); err != nil {
		return fail("header", err)
	}
	sort.Slice(f.tensors, func(i, j int) bool {
		a, b := &f.tensors[i], &f.tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.Name < b.Name
	})
	for i := range f.tensors {
		f.index[f.tensors[i].Name] = i
	}
	return nil
}

// parseMetadata reads the "__metadata__" object, whose values must be
// strings. null is accepted as no metadata, as the reference reader does.
func (f *File) parseMetadata(w *walker) error {
	fail := func(where string, format string, args ...any) error {
		return &FormatError{File: f.Name, Where: where, Msg: fmt.Sprintf(format, args...)}
	}
	tok, err := w.token()
	if err != nil {
		return fail(MetadataKey, "%v", err)
	}
	if tok == nil {
		return nil
	}
	if tok != json.Delim('{') {
		return fail(MetadataKey, "is %s, want an object of strings", kind(tok))
	}
	seen := map[string]bool{}
	for {
		key, done, err := w.key(seen)
		if errors.Is(err, errDuplicate) {
			return fail(fmt.Sprintf("%s key %q", MetadataKey, key), "%v", err)
		}
		if err != nil {
			return fail(MetadataKey, "%v", err)
		}
		if done {
			return nil
		}
		v, err := w.str()
		if err != nil {
			return fail(fmt.Sprintf("%s key %q", MetadataKey, key), "%v", about("value", err))
		}
		f.metadata[key] = v
	}
}

// parseEntry reads one tensor's {"dtype", "shape", "data_offsets"} object
// and checks that the shape fills the data range exactly. Unknown fields
// are skipped, as the reference reader does.
func parseEntry(w *walker, name string) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	if err := w.object(); err != nil {
		return t, about("entry", err)
	}
	var offsets []int64
	seen := map[string]bool{}
	for {
		key, done, err := w.key(seen)
		if errors.Is(err, errDuplicate) {
			return t, about(fmt.Sprintf("field %q", key), err)
		}
		if err != nil {
			return t, err
		}
		if done {
			break
		}
		switch key {
		case "dtype":
			s, err := w.str()
			if err != nil {
				return t, about("dtype", err)
			}
			t.DType = DType(s)
		case "shape":
			if t.Shape, err = w.nonNegInts(); err != nil {
				return t, about("shape", err)
			}
		case "data_offsets":
			if offsets, err = w.nonNegInts(); err != nil {
				return t, about("data_offsets", err)
			}
		default:
			if err := w.skip(); err != nil {
				return t, fmt.Errorf("field %q: %v", key, err)
			}
		}
	}
	for _, field := range []string{"dtype", "shape", "data_offsets"} {
		if !seen[field] {
			return t, fmt.Errorf("missing %q", field)
		}
	}
	if !t.DType.Valid() {
		return t, fmt.Errorf("unknown dtype %q", t.DType)
	}
	if len(offsets) != 2 {
		return t, fmt.Errorf("data_offsets has %d elements, want [begin, end]", len(offsets))
	}
	t.Begin, t.End = offsets[0], offsets[1]
	if t.Begin > t.End {
		return t, fmt.Errorf("data_offsets [%d, %d]: begin is after end", t.Begin, t.End)
	}
	want, ok := shapeBytes(t.Shape, t.DType)
	if !ok {
		return t, fmt.Errorf("shape %v of %s: byte size overflows int64", t.Shape, t.DType)
	}
	if want != t.End-t.Begin {
		return t, fmt.Errorf("shape %v of %s needs %d bytes but data_offsets [%d, %d] hold %d",
			t.Shape, t.DType, want, t.Begin, t.End, t.End-t.Begin)
	}
	return t, nil
}

// shapeBytes returns the product of the dims times the element size, or
// false when it overflows int64. The dims must be non-negative.
func shapeBytes(shape []int64, dt DType) (int64, bool) {
	n := int64(dt.Size())
	for _, d := range shape {
		if d != 0 && n > (1<<63-1)/d {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// checkPlacement verifies that every tensor lies inside the file and that no
// two non-empty tensors overlap. Gaps and trailing bytes are allowed.
func (f *File) checkPlacement() error {
	dataLen := f.Size - f.DataOffset
	var prev *TensorInfo // the non-empty tensor ending furthest so far
	for i := range f.tensors {
		t := &f.tensors[i]
		if t.End > dataLen {
			return &FormatError{File: f.Name, Where: fmt.Sprintf("tensor %q", t.Name),
				Msg: fmt.Sprintf("data [%d, %d) lies outside the file's %d data bytes (file truncated?)", t.Begin, t.End, dataLen)}
		}
		if t.Begin == t.End {
			continue
		}
		if prev != nil && prev.End > t.Begin {
			return &FormatError{File: f.Name, Where: fmt.Sprintf("tensor %q", t.Name),
				Msg: fmt.Sprintf("data [%d, %d) overlaps tensor %q at [%d, %d)", t.Begin, t.End, prev.Name, prev.Begin, prev.End)}
		}
		if prev == nil || t.End > prev.End {
			prev = t
		}
	}
	return nil
}
