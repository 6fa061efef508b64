// Package cuda is the NVIDIA GPU backend: it runs a backend.Program with
// float32 activations in device memory, multiplying by weights uploaded
// in their stored (possibly quantized) type. Decode steps replay a CUDA
// graph of matrix-vector kernels; prefill multiplies by Q8_0 and Q4_0
// weights on int8 tensor-core kernels (mmq.cu) and by the others through
// cuBLAS where it loads.
//
// Nothing is linked at build time. The driver API (libcuda.so.1) and NVRTC
// (libnvrtc.so.13, or .12 under an older driver) are opened at run time
// through purego, so weft builds with CGO_ENABLED=0 and runs on machines
// without a GPU: there New returns an error saying what is missing and the
// caller falls back to the CPU. The kernels are CUDA C embedded in the
// binary (kernels.cu), compiled by NVRTC on first use for the device's
// architecture and cached under os.UserCacheDir()/weft/cuda. cuBLAS
// (libcublas), when it loads, takes the large matrix products of prefill.
//
// Threads: a CUDA context is current per OS thread, and a goroutine may
// move between threads. Every entry point that calls the driver (New,
// Compile, Run, Close) locks its goroutine to its OS thread for the call
// and makes the device's primary context current first, so any goroutine
// may call them.
//
// Setting WEFT_CUDA_SYNC=1 synchronises after every kernel so that an
// error names the op that caused it (slow; for debugging).
package cuda

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"unsafe"

	"github.com/weftlm/weft/backend"
)

// Backend runs programs on one CUDA device.
type Backend struct {
	index  int
	dev    int32
	drv    *driverAPI
	ctx    uintptr // the device's primary context
	module uintptr
	funcs  map[string]uintptr
	target target
	name   string // the device's name
	sms    int    // multiprocessors
	// sharedOptin is the dynamic shared memory a block may opt in to
	// (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).
	sharedOptin int
	closed      bool
	// exact: the module was compiled to the CPU backend's exact contract
	// (WEFT_CUDA_EXACT=1, exactOn) and plans keep to it.
	exact bool

	// cuBLAS for large products, or nil with blasErr saying why not.
	blas       *blasAPI
	blasHandle uintptr
	blasErr    error

	trace *tracer // block tracing (WEFT_CUDA_TRACE=1), else nil
}

// kernelNames lists every kernel of kernels.cu the plan may launch.
func kernelNames() []string {
	names := []string{"rmsnorm", "rope", "store_kv", "attention", "attention_split", "attention_tiled_64", "attention_tiled_128", "add", "glu",
		"gather", "softcap", "quantize_q8", "to_f16", "to_f16_q8", "add_bias", "rmsnorm_q8", "glu_q8", "rope_store", "repack_q8_0", "repack_q4_0", "repack_q8_a",
		"draw", "nucleus_max", "nucleus_pass", "adjust", "logprob", "logprob_end", "mmq_q8_0", "mmq_q4_0", "attention_split_sync",
		"rmsnorm_q8_first", "rope_store_first"} // plan.go's triggerFirst
	cached := []string{"rope_store", "rope_store_first", "store_kv", "attention", "attention_split", "attention_tiled_64", "attention_tiled_128"}
	for _, k := range splitKernels {
		names = append(names, k)
		cached = append(cached, k)
	}
	for _, k := range append(slices.Collect(maps.Values(splitWarpKernels)), splitShallow128) {
		names = append(names, k.name)
		cached = append(cached, k.name)
		for _, ng := range attGroupSizes {
			names = append(names, groupKernel(k, ng)) // float caches only
		}
	}
	for _, name := range cached {
		names = append(names, name+"_h") // over f16 caches
	}
	names = append(names, kquantKernels...)
	names = append(names, "draw_fold") // the draw folded into the output product (sample.go's newFolds)
	for _, t := range embedNormTypes {
		names = append(names, "embed_norm_q8_"+t) // logits.go's fuseEmbedNorm
	}
	for _, k := range logitsTwins {
		names = append(names, foldTwin(k))
	}
	for _, suffix := range weightTypes {
		names = append(names, "embed_"+suffix, "matvec_"+suffix)
		names = append(names, "matvec3_"+suffix, "matvec_glu_"+suffix) // grouped and fused products (plangroup.go)
		if _, ok := oneRowTypes[suffix]; ok {
			names = append(names, "matvec1_"+suffix, "matvec13_"+suffix, "matvec1_glu_"+suffix, "matvec1w_glu_"+suffix)
		}
		if suffix != "f32" && suffix != "f16" {
			names = append(names, "deq_f16_"+suffix)
		}
	}
	return names
}

// New opens CUDA device number device (0 is the first), compiling or
// loading the kernels for it. It fails, without side effects worth
// undoing, when the driver or NVRTC is missing or too old or the device
// does not exist.
func New(device int) (*Backend, error) { return newBackend(device, exactOn()) }

// NewExact is New with kernels kept to the CPU backend's exact contract
// (backend/cpu/exact.go), as WEFT_CUDA_EXACT=1 asks of New: every rounded
// sum in float64, so that a model's logits are those of the CPU's exact
// level (cpu.NewExact) but for values within a few float64 ulps of a
// float32 rounding boundary. Slower: decode loses 16-24 % on an H100,
// prefill more (no cuBLAS, the one-block-a-head attention).
func NewExact(device int) (*Backend, error) { return newBackend(device, true) }

func newBackend(device int, exact bool) (*Backend, error) {
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	var count int32
	if r := d.cuDeviceGetCount(&count); r != 0 {
		return nil, fmt.Errorf("cuda: cuDeviceGetCount: %w", d.err(r))
	}
	if device < 0 || device >= int(count) {
		return nil, fmt.Errorf("cuda: device %d does not exist (%d found)", device, count)
	}
	b := &Backend{index: device, drv: d, exact: exact}
	if r := d.cuDeviceGet(&b.dev, int32(device)); r != 0 {
		return nil, fmt.Errorf("cuda: cuDeviceGet(%d): %w", device, d.err(r))
	}
	var major, minor int32
	if r := d.cuDeviceGetAttribute(&major, attrCCMajor, b.dev); r != 0 {
		return nil, fmt.Errorf("cuda: device %d: compute capability: %w", device, d.err(r))
	}
	if r := d.cuDeviceGetAttribute(&minor, attrCCMinor, b.dev); r != 0 {
		return nil, fmt.Errorf("cuda: device %d: compute capability: %w", device, d.err(r))
	}
	b.name = deviceName(d, b.dev)
	var sms int32
	if r := d.cuDeviceGetAttribute(&sms, attrMultiprocessors, b.dev); r != 0 {
		return nil, fmt.Errorf("cuda: device %d: multiprocessors: %w", device, d.err(r))
	}
	b.sms = int(sms)
	// The shared memory a block may opt in to; a driver that does not say
	// leaves the default 48 KiB.
	var optin int32
	if d.cuDeviceGetAttribute(&optin, attrSharedOptin, b.dev) == 0 {
		b.sharedOptin = int(optin)
	}
	n, err := loadNVRTC(d.version)
	if err != nil {
		return nil, err
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.cuDevicePrimaryCtxRetain(&b.ctx, b.dev); r != 0 {
		return nil, fmt.Errorf("cuda: device %d: cuDevicePrimaryCtxRetain: %w", device, d.err(r))
	}
	if err := b.load(n, int(major)*10+int(minor)); err != nil {
		d.cuDevicePrimaryCtxRelease(b.dev)
		return nil, fmt.Errorf("cuda: device %d (%s): %w", device, b.name, err)
	}
	b.blas, b.blasHandle, b.blasErr = newBLAS(d.version)
	return b, nil
}

// load makes the context current, loads the kernel module (compiling it if
// the cache has none, or a stale one) and looks up every kernel.
func (b *Backend) load(n *nvrtcAPI, arch int) error {
	d := b.drv
	if r := d.cuCtxSetCurrent(b.ctx); r != 0 {
		return fmt.Errorf("cuCtxSetCurrent: %w", d.err(r))
	}
	image, t, path, err := module(n, arch, d.version, b.exact, kActQ8K)
	if err != nil {
		return err
	}
	b.target = t
	r := d.cuModuleLoadData(&b.module, unsafe.Pointer(&image[0]))
	if r != 0 && path != "" {
		// A cached module that no longer loads is rebuilt.
		os.Remove(path)
		if image, err = n.compile(kernelSource, t); err != nil {
			return err
		}
		writeCache(path, image)
		r = d.cuModuleLoadData(&b.module, unsafe.Pointer(&image[0]))
	}
	if r != 0 {
		return fmt.Errorf("loading the kernels (%s): %w", t.option(), d.err(r))
	}
	b.funcs = map[string]uintptr{}
	for _, name := range kernelNames() {
		var f uintptr
		if r := d.cuModuleGetFunction(&f, b.module, name); r != 0 {
			d.cuModuleUnload(b.module)
			return fmt.Errorf("kernel %s: %w", name, d.err(r))
		}
		b.funcs[name] = f
	}
	if traceOn() {
		t, err := newTracer(d, b.module)
		if err != nil {
			d.cuModuleUnload(b.module)
			return err
		}
		b.trace = t
	}
	return nil
}

// optIn lets kernel fn (name) launch with shared bytes of dynamic shared
// memory beyond the default 48 KiB: it allows all that the device gives a
// block less the kernel's static shared memory (the same every time, so
// programs compiled later never lower it).
func (b *Backend) optIn(fn uintptr, name string, shared uint32) error {
	d := b.drv
	var static int32
	if r := d.cuFuncGetAttribute(&static, funcSharedSizeBytes, fn); r != 0 {
		return fmt.Errorf("cuda: kernel %s: static shared memory: %w", name, d.err(r))
	}
	allow := int32(b.sharedOptin) - static
	if int64(shared) > int64(allow) {
		return fmt.Errorf("cuda: kernel %s needs %d bytes of shared memory; the device allows %d", name, shared, allow)
	}
	if r := d.cuFuncSetAttribute(fn, funcMaxDynamicShared, allow); r != 0 {
		return fmt.Errorf("cuda: kernel %s: opting in to %d bytes of shared memory: %w", name, allow, d.err(r))
	}
	return nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return fmt.Sprintf("cuda:%d", b.index) }

// DeviceName is the GPU's name as the driver reports it.
func (b *Backend) DeviceName() string { return b.name }

// CuBLAS names the cuBLAS library large matrix products use, or says why
// none is used (they then run on weft's own kernels).
func (b *Backend) CuBLAS() (string, error) {
	if b.blas == nil {
		return "", b.blasErr
	}
	v := b.blas.version
	return fmt.Sprintf("%s (%d.%d.%d)", b.blas.name, v/10000, v/100%100, v%100), nil
}

// Supports implements backend.Backend.
func (b *Backend) Supports(weightType string) bool {
	_, ok := weightTypes[weightType]
	return ok || convertible(weightType)
}

var errBackendClosed = errors.New("cuda: backend is closed")

// Close implements backend.Backend: it unloads the kernels and releases the
// context. Plans compiled by the backend must be closed first.
func (b *Backend) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := b.drv
	var errs []error
	if r := d.cuCtxSetCurrent(b.ctx); r != 0 {
		errs = append(errs, d.err(r))
	} else {
		if b.blas != nil {
			if r := b.blas.cublasDestroy(b.blasHandle); r != 0 {
				errs = append(errs, fmt.Errorf("cublasDestroy: status %d", r))
			}
		}
		if b.trace != nil {
			d.cuMemFree(b.trace.buf)
		}
		if r := d.cuModuleUnload(b.module); r != 0 {
			errs = append(errs, d.err(r))
		}
	}
	if r := d.cuDevicePrimaryCtxRelease(b.dev); r != 0 {
		errs = append(errs, d.err(r))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: closing device %d: %w", b.index, err)
	}
	return nil
}

// current locks the calling goroutine to its thread and makes the
// backend's context current on it; the caller must call
// runtime.UnlockOSThread when done.
func (b *Backend) current() error {
	runtime.LockOSThread()
	if b.closed {
		return errBackendClosed
	}
	if r := b.drv.cuCtxSetCurrent(b.ctx); r != 0 {
		return fmt.Errorf("cuda: cuCtxSetCurrent: %w", b.drv.err(r))
	}
	return nil
}

var _ backend.Backend = (*Backend)(nil)
