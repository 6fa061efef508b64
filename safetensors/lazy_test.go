package safetensors_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/weftlm/weft/safetensors"
)

// countingReader records every ReadAt made through it.
type countingReader struct {
	r     io.ReaderAt
	mu    sync.Mutex
	reads [][2]int64 // [off, off+len)
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	c.reads = append(c.reads, [2]int64{off, off + int64(len(p))})
	c.mu.Unlock()
	return c.r.ReadAt(p, off)
}

// paddedHeader returns a header of exactly size bytes describing tensors
// laid out back to back; the last one is sized to end at dataLen.
func paddedHeader(t *testing.T, size int, dataLen int64, extraMeta int) string {
	t.Helper()
	const small = 1 << 20
	head := fmt.Sprintf(`{"__metadata__":{"pad":"%s"},"first":{"dtype":"F32","shape":[262144],"data_offsets":[0,%d]},"rest":{"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]}}`,
		strings.Repeat("x", extraMeta), small, dataLen-small, small, dataLen)
	if len(head) > size {
		t.Fatalf("header of %d bytes does not fit in %d", len(head), size)
	}
	return head + strings.Repeat(" ", size-len(head))
}

// TestLazyHeaderRead opens an 8 GiB sparse file through a counting reader:
// NewFile may read only [0, 8+N+64KiB) — one read of the first 64 KiB, and
// one more for the rest of a header longer than that — and never tensor
// data.
func TestLazyHeaderRead(t *testing.T) {
	const fileSize = 8 << 30
	for _, tc := range []struct {
		name       string
		headerSize int
		extraMeta  int
		maxReads   int
	}{
		{"short header", 1024, 10, 1},
		{"header over 64 KiB", 200 << 10, 150 << 10, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sparse.safetensors")
			header := paddedHeader(t, tc.headerSize, fileSize-8-int64(tc.headerSize), tc.extraMeta)
			if err := os.WriteFile(path, rawFile(header, 0), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, fileSize); err != nil {
				t.Skipf("cannot make a sparse 8 GiB file here: %v", err)
			}
			osf, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer osf.Close()
			cr := &countingReader{r: osf}
			f, err := safetensors.NewFile(cr, fileSize, path)
			if err != nil {
				t.Fatal(err)
			}
			limit := int64(8 + tc.headerSize + 64<<10)
			var total int64
			for _, r := range cr.reads {
				if r[0] < 0 || r[1] > limit {
					t.Errorf("read [%d, %d) outside [0, %d)", r[0], r[1], limit)
				}
				total += r[1] - r[0]
			}
			if len(cr.reads) > tc.maxReads || total > limit {
				t.Errorf("%d reads of %d bytes in all, want at most %d reads and %d bytes", len(cr.reads), total, tc.maxReads, limit)
			}
			rest, ok := f.Tensor("rest")
			if !ok || rest.End != fileSize-f.DataOffset || rest.Size() != fileSize-f.DataOffset-1<<20 {
				t.Fatalf("rest = %+v", rest)
			}

			// Reading one tensor reads exactly its bytes.
			cr.reads = nil
			first, _ := f.Tensor("first")
			data, err := f.TensorData(first)
			if err != nil || len(data) != 1<<20 || !bytes.Equal(data, make([]byte, 1<<20)) {
				t.Fatalf("first: %d bytes, %v", len(data), err)
			}
			if len(cr.reads) != 1 || cr.reads[0] != [2]int64{f.DataOffset, f.DataOffset + 1<<20} {
				t.Errorf("reading first made reads %v", cr.reads)
			}

			// Mapped, the end of the 8 GiB tensor is reachable without
			// reading the rest.
			mf, err := safetensors.OpenFile(path, safetensors.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer mf.Close()
			r, _ := mf.Tensor("rest")
			view, err := mf.TensorData(r)
			if err != nil || int64(len(view)) != r.Size() || view[len(view)-1] != 0 {
				t.Fatalf("mapped rest: %d bytes, %v", len(view), err)
			}
		})
	}
}
