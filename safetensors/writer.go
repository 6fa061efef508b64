package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"unicode/utf8"
)

// Writer builds a safetensors file that the Python safetensors library and
// transformers load: "__metadata__" first, then the tensor entries with keys
// sorted, the header padded with spaces so the data starts at a multiple of
// 8 bytes, and the tensors' data laid out back to back in the order they
// were added. (transformers' from_pretrained also wants the metadata
// format=pt, which the caller sets.)
type Writer struct {
	metadata map[string]string
	tensors  []writerTensor
	names    map[string]bool
	end      int64 // data bytes so far
}

type writerTensor struct {
	info TensorInfo
	data []byte
}

// NewWriter returns an empty writer.
func NewWriter() *Writer {
	return &Writer{metadata: map[string]string{}, names: map[string]bool{}}
}

// SetMetadata sets a "__metadata__" entry.
func (w *Writer) SetMetadata(key, value string) { w.metadata[key] = value }

// Add appends a tensor; shape is outermost first and data its bytes in
// row-major order, len(data) = product(shape) × dtype.Size(). The data is
// not copied and must stay unchanged until WriteTo returns.
func (w *Writer) Add(name string, dtype DType, shape []int64, data []byte) error {
	switch {
	case name == MetadataKey:
		return fmt.Errorf("safetensors writer: tensor name %q is reserved for metadata", name)
	case !utf8.ValidString(name):
		return fmt.Errorf("safetensors writer: tensor name %q is not valid UTF-8", name)
	case w.names[name]:
		return fmt.Errorf("safetensors writer: tensor %q added twice", name)
	case !dtype.Valid():
		return fmt.Errorf("safetensors writer: tensor %q: unknown dtype %q", name, dtype)
	}
	for i, d := range shape {
		if d < 0 {
			return fmt.Errorf("safetensors writer: tensor %q: dimension %d is %d, negative", name, i, d)
		}
	}
	size, ok := shapeBytes(shape, dtype)
	if !ok {
		return fmt.Errorf("safetensors writer: tensor %q: shape %v of %s: byte size overflows int64", name, shape, dtype)
	}
	if int64(len(data)) != size {
		return fmt.Errorf("safetensors writer: tensor %q: %d bytes of data, shape %v of %s needs %d", name, len(data), shape, dtype, size)
	}
	info := TensorInfo{Name: name, DType: dtype, Shape: append([]int64{}, shape...), Begin: w.end, End: w.end + size}
	w.names[name] = true
	w.tensors = append(w.tensors, writerTensor{info: info, data: data})
	w.end += size
	return nil
}

// header returns the JSON header, padded with spaces so that 8 + its length
// is a multiple of 8.
func (w *Writer) header() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if len(w.metadata) > 0 {
		keys := make([]string, 0, len(w.metadata))
		for k, v := range w.metadata {
			if !utf8.ValidString(k) || !utf8.ValidString(v) {
				return nil, fmt.Errorf("safetensors writer: metadata %q: not valid UTF-8", k)
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		writeString(&b, MetadataKey)
		b.WriteString(":{")
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(&b, k)
			b.WriteByte(':')
			writeString(&b, w.metadata[k])
		}
		b.WriteByte('}')
	}
	order := make([]*TensorInfo, len(w.tensors))
	for i := range w.tensors {
		order[i] = &w.tensors[i].info
	}
	sort.Slice(order, func(i, j int) bool { return order[i].Name < order[j].Name })
	for i, t := range order {
		if i > 0 || len(w.metadata) > 0 {
			b.WriteByte(',')
		}
		writeString(&b, t.Name)
		b.WriteString(`:{"data_offsets":[`)
		b.WriteString(strconv.FormatInt(t.Begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(t.End, 10))
		b.WriteString(`],"dtype":`)
		writeString(&b, string(t.DType))
		b.WriteString(`,"shape":[`)
		for k, d := range t.Shape {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		b.WriteString("]}")
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), nil
}

// writeString writes s as a JSON string without escaping <, > and &, which
// json.Marshal would turn into \u003c and friends.
func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)           // cannot fail for a string; appends a newline
	b.Truncate(b.Len() - 1) // drop the newline
}

// WriteTo writes the file to out and returns the bytes written.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	header, err := w.header()
	if err != nil {
		return 0, err
	}
	cw := &countingWriter{w: out}
	bw := bufio.NewWriterSize(cw, 1<<20)
	var length [8]byte
	binary.LittleEndian.PutUint64(length[:], uint64(len(header)))
	bw.Write(length[:])
	bw.Write(header)
	for _, t := range w.tensors {
		if _, err := bw.Write(t.data); err != nil {
			return cw.n, err
		}
	}
	return cw.n, bw.Flush()
}

// countingWriter counts the bytes that reach the underlying writer, so
// WriteTo reports what was written rather than what was buffered.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteFile writes w to path, replacing any file there.
func WriteFile(path string, w *Writer) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	return nil
}
