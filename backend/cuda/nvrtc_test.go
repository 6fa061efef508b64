package cuda

import (
	"slices"
	"testing"
)

// TestEnvDefines checks WEFT_CUDA_DEFINES's parsing: upper-case macro
// names, with or without a one-word value, and nothing else; and that the
// defines change the compiled module's cache key.
func TestEnvDefines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"MV1Q_BATCH=8", []string{"-DMV1Q_BATCH=8"}},
		{"MV1Q_BATCH=8,MV13Q_BATCH=8,FLAG", []string{"-DMV1Q_BATCH=8", "-DMV13Q_BATCH=8", "-DFLAG"}},
		{"lower=1,A B=1,X=1 -o,Y=$(z),=3,,Z=0.5", []string{"-DZ=0.5"}},
		// only WEFT_CUDA_EXACT sets the exact kernels (the plan must know)
		{"WEFT_EXACT=1,WEFT_EXACT,FLAG", []string{"-DFLAG"}},
	} {
		if got := envDefines(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.in, got, tc.want)
		}
	}
	base := cacheKey("src", target{arch: 90, cubin: true}, 13000, 13000)
	t.Setenv("WEFT_CUDA_DEFINES", "MV1Q_BATCH=8")
	if cacheKey("src", target{arch: 90, cubin: true}, 13000, 13000) == base {
		t.Error("WEFT_CUDA_DEFINES does not change the cache key")
	}
	t.Setenv("WEFT_CUDA_DEFINES", "")
	exact := target{arch: 90, cubin: true, exact: true}
	if !slices.Contains(compileOptions(exact), "-DWEFT_EXACT=1") || cacheKey("src", exact, 13000, 13000) == base {
		t.Error("an exact target does not compile the exact kernels under their own cache key")
	}
}
