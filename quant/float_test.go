package quant

import (
	"math"
	"testing"
)

func isNaN32(f float32) bool { return f != f }

// Every half converts to float32 and back unchanged (NaNs stay NaNs).
func TestF16RoundTripsEveryValue(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		back := F32ToF16(f)
		if isNaN32(f) {
			if back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
}

// Halfway between two neighbouring halves F32ToF16 picks the even one, and
// one float32 ulp either side of the midpoint picks the nearer one.
func TestF32ToF16RoundsToNearestEven(t *testing.T) {
	for h := uint16(0); h < 0x7c00; h++ {
		lo := float64(F16ToF32(h))
		hi := 65536.0 // the value "after" the largest finite half
		if h < 0x7bff {
			hi = float64(F16ToF32(h + 1))
		}
		mid := float32((lo + hi) / 2) // exact: halves have 11 significant bits
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		for _, sign := range []uint16{0, 0x8000} {
			m := mid
			if sign != 0 {
				m = -mid
			}
			if got := F32ToF16(m); got != even|sign {
				t.Fatalf("midpoint %g of %#04x/%#04x: got %#04x, want %#04x", m, h, h+1, got, even|sign)
			}
			below := math.Nextafter32(m, 0)
			above := math.Nextafter32(m, m*2)
			if got := F32ToF16(below); got != h|sign {
				t.Fatalf("%g just inside %#04x: got %#04x", below, h|sign, got)
			}
			if got := F32ToF16(above); got != (h+1)|sign {
				t.Fatalf("%g just past the midpoint of %#04x: got %#04x", above, h|sign, got)
			}
		}
	}
}

func TestF16Specials(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		f    float32
		want uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},
		{65519.996, 0x7bff},
		{65520, 0x7c00},
		{1e10, 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{nan, 0x7e00},
		{0x1p-14, 0x0400},
		{0x1p-24, 0x0001},
		{0x1p-25, 0x0000},
		{0x1.000002p-25, 0x0001},
		{0x3p-25, 0x0002},
		{0x1p-30, 0x0000},
		{-0x1p-30, 0x8000},
	}
	for _, tc := range tests {
		if got := F32ToF16(tc.f); got != tc.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
}

func TestBF16(t *testing.T) {
	for h := range 1 << 16 {
		f := BF16ToF32(uint16(h))
		back := F32ToBF16(f)
		if isNaN32(f) {
			if back&0x7f80 != 0x7f80 || back&0x40 == 0 {
				t.Fatalf("NaN %#04x came back as %#04x, not a quiet NaN", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
	tests := []struct {
		bits uint32
		want uint16
	}{
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81}, // above the tie
		{0x3f807fff, 0x3f80}, // below the tie
		{0x7f7fffff, 0x7f80}, // largest float rounds to inf
		{0x7f800001, 0x7fc0}, // signalling NaN made quiet
		{0xffa0f000, 0xffe0}, // NaN payload kept, quiet bit set
		{0x00018000, 0x0002}, // subnormals round like normals
	}
	for _, tc := range tests {
		if got := F32ToBF16(math.Float32frombits(tc.bits)); got != tc.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", tc.bits, got, tc.want)
		}
	}
}
