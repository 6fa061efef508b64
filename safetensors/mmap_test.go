package safetensors

import (
	"path/filepath"
	"testing"
	"unsafe"
)

// TestTensorDataZeroCopy checks that a mapped file's TensorData is a view
// of the map, not a copy, and that reading without a map copies.
func TestTensorDataZeroCopy(t *testing.T) {
	w := NewWriter()
	if err := w.Add("a", U8, []int64{3}, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := w.Add("b", F32, []int64{2, 2}, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "z.safetensors")
	if err := WriteFile(path, w); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.Mapped() {
		t.Skip("memory maps are not available on this platform")
	}
	b, _ := f.Tensor("b")
	v1, err := f.TensorData(b)
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := f.TensorData(b)
	if &v1[0] != &v2[0] {
		t.Error("two TensorData calls returned different memory")
	}
	base := uintptr(unsafe.Pointer(&f.mapped[0]))
	addr := uintptr(unsafe.Pointer(&v1[0]))
	if want := base + uintptr(f.DataOffset+b.Begin); addr != want {
		t.Errorf("view at %#x, want %#x inside the map [%#x, +%d)", addr, want, base, len(f.mapped))
	}
	if cap(v1) != 16 {
		t.Errorf("view has capacity %d, want 16 so appends cannot spill into the next tensor", cap(v1))
	}

	nf, err := OpenFile(path, Options{NoMmap: true})
	if err != nil {
		t.Fatal(err)
	}
	defer nf.Close()
	nb, _ := nf.Tensor("b")
	c1, _ := nf.TensorData(nb)
	c2, _ := nf.TensorData(nb)
	if nf.Mapped() || &c1[0] == &c2[0] {
		t.Error("unmapped TensorData returned shared memory")
	}
}

// TestForeignTensorInfo refuses a TensorInfo that belongs to another file.
func TestForeignTensorInfo(t *testing.T) {
	f := &File{Name: "x.safetensors", index: map[string]int{}}
	other := TensorInfo{Name: "w", DType: U8, Shape: []int64{1}, Begin: 0, End: 1}
	if _, err := f.TensorData(&other); err == nil {
		t.Error("TensorData accepted a tensor the file does not hold")
	}
	if err := f.ReadTensor(&other, make([]byte, 1)); err == nil {
		t.Error("ReadTensor accepted a tensor the file does not hold")
	}
}
