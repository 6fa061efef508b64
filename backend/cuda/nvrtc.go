package cuda

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// kernelSource is the CUDA C of every kernel, compiled once per device
// architecture, driver and NVRTC version, then cached.
var kernelSource = kernelsCU + "\n" + matvecCU + "\n" + attentionCU + "\n" + matvecKCU + "\n" + mmqCU + "\n" + sampleCU

var (
	//go:embed kernels.cu
	kernelsCU string
	//go:embed matvec.cu
	matvecCU string
	//go:embed attention.cu
	attentionCU string
	//go:embed sample.cu
	sampleCU string
	//go:embed mmq.cu
	mmqCU string
)

// nvrtcAPI is the part of libnvrtc weft calls.
type nvrtcAPI struct {
	nvrtcVersion              func(major, minor *int32) int32                                                     `sym:"nvrtcVersion"`
	nvrtcGetErrorString       func(r int32) string                                                                `sym:"nvrtcGetErrorString"`
	nvrtcGetNumSupportedArchs func(n *int32) int32                                                                `sym:"nvrtcGetNumSupportedArchs"`
	nvrtcGetSupportedArchs    func(archs *int32) int32                                                            `sym:"nvrtcGetSupportedArchs"`
	nvrtcCreateProgram        func(prog *uintptr, src, name string, n int32, headers, names unsafe.Pointer) int32 `sym:"nvrtcCreateProgram"`
	nvrtcCompileProgram       func(prog uintptr, n int32, opts **byte) int32                                      `sym:"nvrtcCompileProgram"`
	nvrtcGetProgramLogSize    func(prog uintptr, n *uint64) int32                                                 `sym:"nvrtcGetProgramLogSize"`
	nvrtcGetProgramLog        func(prog uintptr, log *byte) int32                                                 `sym:"nvrtcGetProgramLog"`
	nvrtcGetCUBINSize         func(prog uintptr, n *uint64) int32                                                 `sym:"nvrtcGetCUBINSize"`
	nvrtcGetCUBIN             func(prog uintptr, out *byte) int32                                                 `sym:"nvrtcGetCUBIN"`
	nvrtcGetPTXSize           func(prog uintptr, n *uint64) int32                                                 `sym:"nvrtcGetPTXSize"`
	nvrtcGetPTX               func(prog uintptr, out *byte) int32                                                 `sym:"nvrtcGetPTX"`
	nvrtcDestroyProgram       func(prog *uintptr) int32                                                           `sym:"nvrtcDestroyProgram"`

	version int // 1000*major + 10*minor, like the driver's
}

// nvrtcNames are the NVRTC libraries tried, newest first and none newer
// than the driver's CUDA major version (its output would not load).
func nvrtcNames(driverMajor int) []string {
	return toolkitLibNames("WEFT_NVRTC", "libnvrtc", driverMajor)
}

// toolkitLibNames lists where a CUDA toolkit library (stem "libnvrtc")
// may be: the path in the environment variable env, then by soname (the
// loader's search path) and in the usual toolkit folders, for major
// versions from the driver's (at most 13) down to 12.
func toolkitLibNames(env, stem string, driverMajor int) []string {
	var names []string
	if p := os.Getenv(env); p != "" {
		names = append(names, p)
	}
	dirs := []string{""}
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if d := os.Getenv(env); d != "" {
			dirs = append(dirs, filepath.Join(d, "lib64"), filepath.Join(d, "lib"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda/targets/sbsa-linux/lib")
	for major := min(driverMajor, 13); major >= 12; major-- {
		so := fmt.Sprintf("%s.so.%d", stem, major)
		for _, d := range dirs {
			names = append(names, filepath.Join(d, so))
		}
	}
	return names
}

var (
	nvrtcOnce sync.Once
	nvrtc     *nvrtcAPI
	nvrtcErr  error
)

// loadNVRTC loads NVRTC once per process, for a driver of CUDA version
// driverVersion.
func loadNVRTC(driverVersion int) (*nvrtcAPI, error) {
	nvrtcOnce.Do(func() {
		n := &nvrtcAPI{}
		if _, _, err := loadLib(nvrtcNames(driverVersion/1000), n); err != nil {
			nvrtcErr = fmt.Errorf("cuda: cannot load NVRTC (libnvrtc.so.13 from the CUDA toolkit or the nvidia-cuda-nvrtc package; set WEFT_NVRTC to its path): %w", err)
			return
		}
		var major, minor int32
		if r := n.nvrtcVersion(&major, &minor); r != 0 {
			nvrtcErr = fmt.Errorf("cuda: nvrtcVersion: %s", n.nvrtcGetErrorString(r))
			return
		}
		n.version = int(major)*1000 + int(minor)*10
		nvrtc = n
	})
	return nvrtc, nvrtcErr
}

// target is what NVRTC compiles for: machine code (cubin) for the device's
// own architecture when NVRTC knows it, else PTX for the newest virtual
// architecture it knows below the device's, which the driver finishes.
type target struct {
	arch  int  // 90 for compute capability 9.0
	cubin bool // false: PTX
	exact bool // kernels.cu's WEFT_EXACT: the CPU backend's exact contract
	kq8k  bool // K_A32=0: K-quant products on Q8_K records (kActQ8K when the backend opened)
}

func (t target) option() string {
	if t.cubin {
		return fmt.Sprintf("--gpu-architecture=sm_%d", t.arch)
	}
	return fmt.Sprintf("--gpu-architecture=compute_%d", t.arch)
}

// chooseTarget picks the target for a device of architecture arch given the
// architectures NVRTC supports.
func chooseTarget(arch int, supported []int) (target, error) {
	if slices.Contains(supported, arch) {
		return target{arch: arch, cubin: true}, nil
	}
	best := 0
	for _, a := range supported {
		if a < arch && a > best {
			best = a
		}
	}
	if best == 0 {
		return target{}, fmt.Errorf("NVRTC supports architectures %v, none at or below the device's sm_%d", supported, arch)
	}
	return target{arch: best}, nil
}

// compileOptions are NVRTC's options for t besides the architecture;
// with WEFT_CUDA_TRACE=1 the module also records every block (trace.go).
func compileOptions(t target) []string {
	opts := []string{"--std=c++17", "-default-device"}
	if traceOn() {
		opts = append(opts, "-DWEFT_TRACE")
	}
	if t.exact {
		opts = append(opts, "-DWEFT_EXACT=1")
	}
	if kHeadGGML {
		opts = append(opts, "-DKHEAD_GGML=1") // kquant.go's upload keeps the file's header order
	}
	if t.kq8k && !t.exact {
		opts = append(opts, "-DK_A32=0") // the plan's kA32 is off with it
	}
	// WEFT_CUDA_LATE: kernel classes (all, glu, mv: the other products,
	// K-quants included; attn) that let the next launch start only as
	// their blocks leave (kernels.cu's PDL_* and TRIGGER_*), for
	// comparisons.
	for c := range strings.SplitSeq(os.Getenv("WEFT_CUDA_LATE"), ",") {
		if slices.Contains([]string{"all", "glu", "mv", "attn"}, c) {
			opts = append(opts, "-DWEFT_LATE_"+strings.ToUpper(c))
		}
	}
	return append(opts, envDefines(os.Getenv("WEFT_CUDA_DEFINES"))...)
}

// envDefines turns WEFT_CUDA_DEFINES (NAME=VALUE or NAME, comma-separated)
// into -D options, for comparisons of the kernels' tunables (such as
// matvec.cu's MV1Q_BATCH); an entry that is not an upper-case macro name
// with an optional word for its value is ignored.
func envDefines(s string) []string {
	var opts []string
	for d := range strings.SplitSeq(s, ",") {
		name, value, _ := strings.Cut(d, "=")
		if !macroName.MatchString(name) || !macroValue.MatchString(value) || name == "WEFT_EXACT" || name == "K_A32" {
			// WEFT_EXACT and K_A32 change what the plan must upload
			// and launch (Backend.exact, planOptions.kA32): only
			// WEFT_CUDA_EXACT and WEFT_CUDA_KACT set them.
			continue
		}
		opts = append(opts, "-D"+d)
	}
	return opts
}

var (
	macroName  = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	macroValue = regexp.MustCompile(`^[A-Za-z0-9_.]*$`)
)

// cacheKey names a compiled module: it changes with the source, the
// options, the target and the driver and NVRTC versions.
func cacheKey(source string, t target, driverVersion, nvrtcVersion int) string {
	h := sha256.New()
	fmt.Fprintf(h, "weft-cuda\x00%s\x00%s\x00%d\x00%d\x00", t.option(), strings.Join(compileOptions(t), " "), driverVersion, nvrtcVersion)
	h.Write([]byte(source))
	ext := "ptx"
	if t.cubin {
		ext = "cubin"
	}
	return fmt.Sprintf("sm_%d-%s.%s", t.arch, hex.EncodeToString(h.Sum(nil)[:12]), ext)
}

// cacheDir is where compiled modules are kept: os.UserCacheDir()/weft/cuda.
func cacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "weft", "cuda"), nil
}

// module returns the compiled kernels for a device of architecture arch
// (to the exact contract when exact is set):
// from the cache when present (then cached is its path, so a stale file can
// be replaced), else compiled by NVRTC and stored. A cache that cannot be
// written is skipped, not an error.
func module(n *nvrtcAPI, arch, driverVersion int, exact, kq8k bool) (image []byte, t target, cached string, err error) {
	supported, err := n.archs()
	if err != nil {
		return nil, target{}, "", err
	}
	if t, err = chooseTarget(arch, supported); err != nil {
		return nil, t, "", err
	}
	t.exact, t.kq8k = exact, kq8k
	path := ""
	if dir, err := cacheDir(); err == nil {
		path = filepath.Join(dir, cacheKey(kernelSource, t, driverVersion, n.version))
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b, t, path, nil
		}
	}
	if image, err = n.compile(kernelSource, t); err != nil {
		return nil, t, "", err
	}
	if path != "" {
		writeCache(path, image)
	}
	return image, t, "", nil
}

// writeCache stores a compiled module atomically (temporary file, rename),
// so concurrent processes never read half a file.
func writeCache(path string, image []byte) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return
	}
	_, werr := f.Write(image)
	cerr := f.Close()
	if werr != nil || cerr != nil || os.Rename(f.Name(), path) != nil {
		os.Remove(f.Name())
	}
}

// archs lists the real architectures NVRTC compiles for (90 for sm_90).
func (n *nvrtcAPI) archs() ([]int, error) {
	var count int32
	if r := n.nvrtcGetNumSupportedArchs(&count); r != 0 || count <= 0 {
		return nil, fmt.Errorf("nvrtcGetNumSupportedArchs: %s", n.nvrtcGetErrorString(r))
	}
	raw := make([]int32, count)
	if r := n.nvrtcGetSupportedArchs(&raw[0]); r != 0 {
		return nil, fmt.Errorf("nvrtcGetSupportedArchs: %s", n.nvrtcGetErrorString(r))
	}
	archs := make([]int, count)
	for i, a := range raw {
		archs[i] = int(a)
	}
	return archs, nil
}

// CompileError is a failed NVRTC compilation with its full log.
type CompileError struct {
	Option string // the architecture option
	Result string
	Log    string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("cuda: NVRTC (%s): %s\n%s", e.Option, e.Result, e.Log)
}

// compile runs NVRTC on source for target t and returns a cubin, or a
// NUL-terminated PTX text.
func (n *nvrtcAPI) compile(source string, t target) ([]byte, error) {
	var prog uintptr
	if r := n.nvrtcCreateProgram(&prog, source, "weft_kernels.cu", 0, nil, nil); r != 0 {
		return nil, fmt.Errorf("cuda: nvrtcCreateProgram: %s", n.nvrtcGetErrorString(r))
	}
	defer n.nvrtcDestroyProgram(&prog)
	opts := append([]string{t.option()}, compileOptions(t)...)
	cstrs := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts))
	for i, o := range opts {
		cstrs[i] = append([]byte(o), 0)
		ptrs[i] = &cstrs[i][0]
	}
	r := n.nvrtcCompileProgram(prog, int32(len(ptrs)), &ptrs[0])
	runtime.KeepAlive(cstrs)
	if r != 0 {
		return nil, &CompileError{Option: t.option(), Result: n.nvrtcGetErrorString(r), Log: n.log(prog)}
	}
	getSize, get := n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN
	if !t.cubin {
		getSize, get = n.nvrtcGetPTXSize, n.nvrtcGetPTX
	}
	var size uint64
	if r := getSize(prog, &size); r != 0 || size == 0 {
		return nil, fmt.Errorf("cuda: NVRTC output size: %s", n.nvrtcGetErrorString(r))
	}
	out := make([]byte, size)
	if r := get(prog, &out[0]); r != 0 {
		return nil, fmt.Errorf("cuda: NVRTC output: %s", n.nvrtcGetErrorString(r))
	}
	return out, nil
}

// log returns the program's compilation log.
func (n *nvrtcAPI) log(prog uintptr) string {
	var size uint64
	if n.nvrtcGetProgramLogSize(prog, &size) != 0 || size <= 1 {
		return ""
	}
	b := make([]byte, size)
	if n.nvrtcGetProgramLog(prog, &b[0]) != 0 {
		return ""
	}
	return strings.TrimRight(string(b), "\x00\n")
}
