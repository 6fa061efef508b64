//go:build amd64 && !purego

package cpu

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"
)

// TestKernelTables checks that every packed format has assembly kernels on
// both instruction sets (so TestGEMM exercises them rather than the
// portable fallback) and that the levels this machine supports are
// registered.
func TestKernelTables(t *testing.T) {
	for typ, f := range formats {
		for name, tab := range map[string]map[family]map[string]kernelPair{"avx2": avx2Kernels, "avx512vnni": vnniKernels, "exact": vnniExactKernels} {
			// AVX2 stores offset-128 levels signed (isa.signed8)
			p := &packed{f: f, signed8: name == "avx2" && f.offset == 128 && !f.u4}
			if _, ok := tab[f.family][variantOf(p)]; !ok {
				t.Errorf("%s: no %s kernel for variant %q", typ, name, variantOf(p))
			}
		}
	}
	want := 2 // the portable and exact levels
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C {
		want++
		if cpu.X86.HasAVX512VL && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VNNI {
			want += 2 // and the exact level's VNNI kernels
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

// TestAVX2KernelsAvoidEVEX: the AVX2 level must run on CPUs without
// AVX-512, which this machine cannot show by running them, so the
// assembly is checked instead: no AVX-512 instruction, embedded broadcast
// or register above Y15 in any function the AVX2 level calls.
func TestAVX2KernelsAvoidEVEX(t *testing.T) {
	evex := regexp.MustCompile(`VPXORD|VPANDD|VPORD|VMOVDQU(32|64)|VPDPBUSD|\.BCST|\.Z\b|\bY(1[6-9]|2[0-9]|3[01])\b|\bZ[0-9]+\b|\bK[1-7]\b`)
	for _, file := range []string{"kernels_amd64.s", "vec_amd64.s", "quant_amd64.s"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		fn := ""
		for i, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(line, "TEXT ") {
				fn = line
			}
			// every function outside the generated VNNI kernels serves AVX2
			if strings.Contains(fn, "VNNI") || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			if evex.MatchString(line) {
				t.Errorf("%s:%d: %q in %s", file, i+1, strings.TrimSpace(line), fn)
			}
		}
	}
}
