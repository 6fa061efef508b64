package cuda

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// cuResult is a CUresult.
type cuResult int32

// Device attributes (CUdevice_attribute) read by Devices.
const (
	attrMultiprocessors = 16
	attrL2Bytes         = 38
	attrSharedOptin     = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
	attrCCMajor         = 75
	attrCCMinor         = 76
)

// Function attributes (CUfunction_attribute).
const (
	funcSharedSizeBytes  = 1 // CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: static shared memory
	funcMaxDynamicShared = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
)

// minDriver is the oldest driver API accepted: CUDA 12.0 (cuLaunchKernelEx).
const minDriver = 12000

// driverAPI is the part of libcuda.so.1 weft calls. Fields are filled by
// loadLib from their sym tags; every pointer argument points to Go memory
// that lives for the call or to device memory.
type driverAPI struct {
	cuInit                    func(flags uint32) cuResult                                                                                   `sym:"cuInit"`
	cuDriverGetVersion        func(v *int32) cuResult                                                                                       `sym:"cuDriverGetVersion"`
	cuDeviceGetCount          func(n *int32) cuResult                                                                                       `sym:"cuDeviceGetCount"`
	cuDeviceGet               func(dev *int32, ordinal int32) cuResult                                                                      `sym:"cuDeviceGet"`
	cuDeviceGetName           func(name *byte, n int32, dev int32) cuResult                                                                 `sym:"cuDeviceGetName"`
	cuDeviceGetAttribute      func(v *int32, attr int32, dev int32) cuResult                                                                `sym:"cuDeviceGetAttribute"`
	cuDeviceTotalMem          func(bytes *uint64, dev int32) cuResult                                                                       `sym:"cuDeviceTotalMem_v2"`
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) cuResult                                                                        `sym:"cuDevicePrimaryCtxRetain"`
	cuDevicePrimaryCtxRelease func(dev int32) cuResult                                                                                      `sym:"cuDevicePrimaryCtxRelease_v2"`
	cuCtxSetCurrent           func(ctx uintptr) cuResult                                                                                    `sym:"cuCtxSetCurrent"`
	cuCtxSynchronize          func() cuResult                                                                                               `sym:"cuCtxSynchronize"`
	cuMemGetInfo              func(free, total *uint64) cuResult                                                                            `sym:"cuMemGetInfo_v2"`
	cuMemAlloc                func(p *uint64, size uint64) cuResult                                                                         `sym:"cuMemAlloc_v2"`
	cuMemFree                 func(p uint64) cuResult                                                                                       `sym:"cuMemFree_v2"`
	cuMemsetD8                func(p uint64, v uint8, n uint64) cuResult                                                                    `sym:"cuMemsetD8_v2"`
	cuModuleLoadData          func(mod *uintptr, image unsafe.Pointer) cuResult                                                             `sym:"cuModuleLoadData"`
	cuModuleUnload            func(mod uintptr) cuResult                                                                                    `sym:"cuModuleUnload"`
	cuModuleGetFunction       func(fn *uintptr, mod uintptr, name string) cuResult                                                          `sym:"cuModuleGetFunction"`
	cuFuncSetAttribute        func(fn uintptr, attr int32, v int32) cuResult                                                                `sym:"cuFuncSetAttribute"`
	cuFuncGetAttribute        func(v *int32, attr int32, fn uintptr) cuResult                                                               `sym:"cuFuncGetAttribute"`
	cuModuleGetGlobal         func(p *uint64, bytes *uint64, mod uintptr, name string) cuResult                                             `sym:"cuModuleGetGlobal_v2"`
	cuGetErrorName            func(r cuResult, s **byte) cuResult                                                                           `sym:"cuGetErrorName"`
	cuGetErrorString          func(r cuResult, s **byte) cuResult                                                                           `sym:"cuGetErrorString"`
	cuMemHostAlloc            func(p *unsafe.Pointer, size uint64, flags uint32) cuResult                                                   `sym:"cuMemHostAlloc"`
	cuMemFreeHost             func(p unsafe.Pointer) cuResult                                                                               `sym:"cuMemFreeHost"`
	cuMemHostGetDevicePointer func(d *uint64, p unsafe.Pointer, flags uint32) cuResult                                                      `sym:"cuMemHostGetDevicePointer_v2"`
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, n uint64) cuResult                                                       `sym:"cuMemcpyHtoD_v2"`
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, n uint64) cuResult                                                       `sym:"cuMemcpyDtoH_v2"`
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) cuResult `sym:"cuLaunchKernel"`
	cuStreamCreate            func(s *uintptr, flags uint32) cuResult                                                                       `sym:"cuStreamCreate"`
	cuStreamDestroy           func(s uintptr) cuResult                                                                                      `sym:"cuStreamDestroy_v2"`
	cuStreamBeginCapture      func(s uintptr, mode int32) cuResult                                                                          `sym:"cuStreamBeginCapture_v2"`
	cuStreamEndCapture        func(s uintptr, graph *uintptr) cuResult                                                                      `sym:"cuStreamEndCapture"`
	cuGraphInstantiate        func(exec *uintptr, graph uintptr, flags uint64) cuResult                                                     `sym:"cuGraphInstantiateWithFlags"`
	cuGraphDestroy            func(graph uintptr) cuResult                                                                                  `sym:"cuGraphDestroy"`
	cuGraphExecDestroy        func(exec uintptr) cuResult                                                                                   `sym:"cuGraphExecDestroy"`
	cuEventCreate             func(ev *uintptr, flags uint32) cuResult                                                                      `sym:"cuEventCreate"`
	cuEventDestroy            func(ev uintptr) cuResult                                                                                     `sym:"cuEventDestroy_v2"`
	cuEventRecord             func(ev, stream uintptr) cuResult                                                                             `sym:"cuEventRecord"`
	cuStreamWaitEvent         func(stream, ev uintptr, flags uint32) cuResult                                                               `sym:"cuStreamWaitEvent"`
	cuMemcpyDtoHAsync         func(dst uintptr, src uint64, n uintptr, stream uintptr) cuResult                                             `sym:"cuMemcpyDtoHAsync_v2"`

	// The calls a replay makes go through purego.SyscallN with arguments
	// prepared at compile time, which does not allocate.
	ctxSetCurrent uintptr `raw:"cuCtxSetCurrent"`
	launchKernel  uintptr `raw:"cuLaunchKernel"`
	memcpyDtoH    uintptr `raw:"cuMemcpyDtoH_v2"`
	htoDAsync     uintptr `raw:"cuMemcpyHtoDAsync_v2"`
	dtoHAsync     uintptr `raw:"cuMemcpyDtoHAsync_v2"`
	ctxSync       uintptr `raw:"cuCtxSynchronize"`
	graphLaunch   uintptr `raw:"cuGraphLaunch"`
	launchEx      uintptr `raw:"cuLaunchKernelEx"`
	eventRecord   uintptr `raw:"cuEventRecord"`
	eventSync     uintptr `raw:"cuEventSynchronize"`

	version int // cuDriverGetVersion: 1000*major + 10*minor
}

// loadLib opens the first library of names that loads and binds every
// field of api (a pointer to a struct) tagged sym (a typed purego
// function) or raw (the symbol's address).
func loadLib(names []string, api any) (uintptr, string, error) {
	var lib uintptr
	var name string
	var errs []string
	// dlerror is per thread: dlopen and the dlerror that explains its
	// failure must run on one thread, or the reason comes back empty.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, n := range names {
		h, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			lib, name = h, n
			break
		}
		msg := err.Error()
		if msg == "" {
			msg = n + ": cannot be opened"
		}
		errs = append(errs, msg)
	}
	if lib == 0 {
		return 0, "", errors.New(strings.Join(errs, "; "))
	}
	v := reflect.ValueOf(api).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		sym, typed := f.Tag.Lookup("sym")
		if !typed {
			if sym = f.Tag.Get("raw"); sym == "" {
				continue
			}
		}
		addr, err := purego.Dlsym(lib, sym)
		if err != nil || addr == 0 {
			purego.Dlclose(lib)
			return 0, "", fmt.Errorf("%s has no symbol %s (too old?)", name, sym)
		}
		field := v.Field(i)
		if typed {
			purego.RegisterFunc(reflect.NewAt(field.Type(), unsafe.Pointer(field.UnsafeAddr())).Interface(), addr)
		} else {
			reflect.NewAt(field.Type(), unsafe.Pointer(field.UnsafeAddr())).Elem().SetUint(uint64(addr))
		}
	}
	return lib, name, nil
}

var (
	driverOnce sync.Once
	driver     *driverAPI
	driverErr  error
)

// loadDriver loads libcuda.so.1 and initialises it, once per process.
func loadDriver() (*driverAPI, error) {
	driverOnce.Do(func() {
		d := &driverAPI{}
		if _, _, err := loadLib([]string{"libcuda.so.1", "libcuda.so"}, d); err != nil {
			driverErr = fmt.Errorf("%w (no NVIDIA driver installed?): %v", ErrNoDriver, err)
			return
		}
		if r := d.cuInit(0); r != 0 {
			driverErr = fmt.Errorf("cuda: cuInit: %w", d.err(r))
			return
		}
		var v int32
		if r := d.cuDriverGetVersion(&v); r != 0 {
			driverErr = fmt.Errorf("cuda: cuDriverGetVersion: %w", d.err(r))
			return
		}
		d.version = int(v)
		if d.version < minDriver {
			driverErr = fmt.Errorf("cuda: the NVIDIA driver supports CUDA %s; weft needs %s or newer", versionString(d.version), versionString(minDriver))
			return
		}
		driver = d
	})
	return driver, driverErr
}

// ErrNoDriver is the error, wrapped, of every call that needs the driver
// where libcuda cannot be loaded: a machine without an NVIDIA driver.
var ErrNoDriver = errors.New("cuda: cannot load the NVIDIA driver library libcuda.so.1")

// versionString spells a CUDA version number (12040) as "12.4".
func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// Error is a failed driver call.
type Error struct {
	Code cuResult
	Name string // CUDA_ERROR_OUT_OF_MEMORY
	Desc string
}

func (e *Error) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("%s (%d): %s", e.Name, e.Code, e.Desc)
	}
	return fmt.Sprintf("%s (%d)", e.Name, e.Code)
}

// err turns a CUresult into an *Error (nil for CUDA_SUCCESS).
func (d *driverAPI) err(r cuResult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Code: r, Name: "CUDA error"}
	var s *byte
	if d.cuGetErrorName(r, &s) == 0 {
		e.Name = cString(s)
	}
	if d.cuGetErrorString(r, &s) == 0 {
		e.Desc = cString(s)
	}
	return e
}

// cString copies a NUL-terminated C string.
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// callArgs holds the arguments of a raw call. purego.SyscallN keeps the
// memory its arguments point to alive by moving each call's argument
// slice to the heap; a slice of an array that already lives there (a field
// of a heap object) costs no allocation, so a replay makes its calls
// through one of these.
type callArgs [19]uintptr

// call calls fn with the first n arguments, which are integers, device
// addresses, or addresses of Go heap memory the caller keeps alive, and
// returns its CUresult.
func (c *callArgs) call(fn uintptr, n int) cuResult {
	r, _, _ := purego.SyscallN(fn, c[:n]...)
	return cuResult(int32(uint32(r)))
}
