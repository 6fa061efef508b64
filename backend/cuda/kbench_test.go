package cuda

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/weftlm/weft/ggml"
	"github.com/weftlm/weft/gguf"
	"github.com/weftlm/weft/quant"
)

// TestRequantBenchModels writes benchmark models of the slow-to-quantize
// types (the K-quants take seconds per million elements to quantize, so
// `weft synth` at 1B size takes minutes on one core): it re-quantizes the
// F16 matrices of the GGUF in $WEFT_BENCH_REQUANT to each type in
// $WEFT_BENCH_TYPES on every core, writing the file beside it with the
// type in place of "F16" in its name.
func TestRequantBenchModels(t *testing.T) {
	src, list := os.Getenv("WEFT_BENCH_REQUANT"), os.Getenv("WEFT_BENCH_TYPES")
	if src == "" || list == "" || !strings.Contains(filepath.Base(src), "F16") {
		t.Skip("set WEFT_BENCH_REQUANT to an F16 GGUF (F16 in its name) and WEFT_BENCH_TYPES to types, comma-separated")
	}
	f, err := gguf.OpenFile(src, gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, name := range strings.Split(list, ",") {
		typ, err := ggml.ParseType(name)
		if err != nil {
			t.Fatal(err)
		}
		gw := gguf.NewWriter()
		for _, kv := range f.KVs {
			gw.SetKV(kv.Key, kv.Value)
		}
		for i := range f.Tensors {
			ti := &f.Tensors[i]
			data, err := f.TensorData(ti)
			if err != nil {
				t.Fatal(err)
			}
			if len(ti.Dims) != 2 || ti.Type != ggml.F16 || ti.Dims[0]%typ.BlockSize() != 0 {
				if err := gw.AddTensor(ti.Name, ti.Type, ti.Dims, data); err != nil {
					t.Fatal(err)
				}
				continue
			}
			out, err := requantize(data, int(ti.Dims[1]), int(ti.Dims[0]), typ)
			if err != nil {
				t.Fatalf("%s: %v", ti.Name, err)
			}
			if err := gw.AddTensor(ti.Name, typ, ti.Dims, out); err != nil {
				t.Fatal(err)
			}
		}
		dst := filepath.Join(filepath.Dir(src), strings.Replace(filepath.Base(src), "F16", typ.String(), 1))
		w, err := os.Create(dst)
		if err != nil {
			t.Fatal(err)
		}
		_, err = gw.WriteTo(w)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", dst)
	}
}

// requantize converts an F16 matrix [rows, cols] to typ, rows split over
// every core.
func requantize(data []byte, rows, cols int, typ ggml.Type) ([]byte, error) {
	rb, err := typ.RowBytes(uint64(cols))
	if err != nil {
		return nil, err
	}
	out := make([]byte, rows*int(rb))
	workers := runtime.GOMAXPROCS(0)
	per := (rows + workers - 1) / workers
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for k := range workers {
		r0, r1 := min(rows, k*per), min(rows, (k+1)*per)
		wg.Add(1)
		go func() {
			defer wg.Done()
			vals := make([]float32, cols)
			for r := r0; r < r1 && errs[k] == nil; r++ {
				if errs[k] = quant.Dequantize(ggml.F16, data[r*cols*2:(r+1)*cols*2], vals); errs[k] == nil {
					errs[k] = quant.Quantize(typ, vals, out[r*int(rb):(r+1)*int(rb)])
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
