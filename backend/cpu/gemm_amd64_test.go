//go:build amd64 && !purego

package cpu

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// TestKernelTables checks that every packed format has assembly kernels on
// both instruction sets (so TestGEMM exercises them rather than the
// portable fallback) and that the levels this machine supports are
// registered.
func TestKernelTables(t *testing.T) {
	for typ, f := range formats {
		for name, tab := range map[string]map[family]map[string]kernelPair{"avx2": avx2Kernels, "avx512vnni": vnniKernels} {
			// AVX2 stores offset-128 levels signed (isa.signed8)
			p := &packed{f: f, signed8: name == "avx2" && f.offset == 128 && !f.u4}
			if _, ok := tab[f.family][variantOf(p)]; !ok {
				t.Errorf("%s: no %s kernel for variant %q", typ, name, variantOf(p))
			}
		}
	}
	want := 1
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C {
		want++
		if cpu.X86.HasAVX512VL && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VNNI {
			want++
		}
	}
	if len(isas) != want {
		t.Errorf("%d kernel levels registered, want %d", len(isas), want)
	}
	t.Logf("levels: %v", func() (n []string) {
		for _, k := range isas {
			n = append(n, k.name)
		}
		return n
	}())
}
