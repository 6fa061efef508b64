package cuda

import (
	"fmt"
	"os"
	"sync"
)

// cuBLAS runs the large matrix products (prefill) on the tensor cores. It
// is optional: where libcublas cannot be loaded, or WEFT_CUBLAS=0, every
// product takes the matrix-vector kernels, which are correct for any
// number of rows but read each weight once per eight of them.

// blasAPI is the part of libcublas weft calls.
type blasAPI struct {
	cublasCreate     func(h *uintptr) int32          `sym:"cublasCreate_v2"`
	cublasDestroy    func(h uintptr) int32           `sym:"cublasDestroy_v2"`
	cublasGetVersion func(h uintptr, v *int32) int32 `sym:"cublasGetVersion_v2"`
	// cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda,
	// B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo): 19
	// arguments, called raw from a run.
	gemmEx uintptr `raw:"cublasGemmEx"`

	name    string // the library loaded
	version int    // e.g. 130100 for 13.1.0, once a handle exists
}

// cuBLAS constants (cublas_api.h, library_types.h).
const (
	blasOpN        = 0
	blasOpT        = 1
	blasR16F       = 2  // CUDA_R_16F
	blasR32F       = 0  // CUDA_R_32F
	blasCompute32F = 68 // CUBLAS_COMPUTE_32F
)

// blasAlgoDefault is CUBLAS_GEMM_DEFAULT (-1) as the callee reads it.
const blasAlgoDefault = ^uintptr(0)

var (
	blasOnce sync.Once
	blas     *blasAPI
	blasErr  error
)

// loadBLAS loads libcublas once per process, for a driver of CUDA version
// driverVersion.
func loadBLAS(driverVersion int) (*blasAPI, error) {
	blasOnce.Do(func() {
		if os.Getenv("WEFT_CUBLAS") == "0" {
			blasErr = fmt.Errorf("cuda: cuBLAS disabled by WEFT_CUBLAS=0")
			return
		}
		b := &blasAPI{}
		_, name, err := loadLib(toolkitLibNames("WEFT_CUBLAS", "libcublas", driverVersion/1000), b)
		if err != nil {
			blasErr = fmt.Errorf("cuda: cannot load cuBLAS (libcublas.so.13 from the CUDA toolkit or the nvidia-cublas package; set WEFT_CUBLAS to its path): %w", err)
			return
		}
		b.name = name
		blas = b
	})
	return blas, blasErr
}

// newBLAS loads cuBLAS and creates a handle in the current context; it
// returns the reason when cuBLAS is not usable.
func newBLAS(driverVersion int) (*blasAPI, uintptr, error) {
	b, err := loadBLAS(driverVersion)
	if err != nil {
		return nil, 0, err
	}
	var h uintptr
	if r := b.cublasCreate(&h); r != 0 {
		return nil, 0, fmt.Errorf("cuda: cublasCreate: status %d", r)
	}
	var v int32
	if b.cublasGetVersion(h, &v) == 0 {
		b.version = int(v)
	}
	return b, h, nil
}
