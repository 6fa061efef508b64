package placement

import (
	"math"
	"strings"
	"testing"
)

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// model is n layers of 1 GiB each, a 0.5 GiB embedding and output, KV of
// kvPerPos bytes per position per layer (sliding layers hold at most 256).
func model(n int, kvPerPos int64, sliding ...int) Model {
	m := Model{EmbedBytes: gib / 2, OutputBytes: gib / 2, WorkBytes: gib / 4}
	for range n {
		m.LayerBytes = append(m.LayerBytes, gib)
	}
	slide := map[int]bool{}
	for _, l := range sliding {
		slide[l] = true
	}
	m.KVBytes = func(l, ctx int) int64 {
		if slide[l] {
			ctx = min(ctx, 256)
		}
		return int64(ctx) * kvPerPos
	}
	return m
}

func layout(p Plan) string {
	var b strings.Builder
	for _, part := range p.Parts {
		dev := "cpu"
		if part.Device >= 0 {
			dev = string(rune('A' + part.Device))
		}
		b.WriteString(dev)
		b.WriteString("[")
		b.WriteString(strings.Repeat("#", part.EndLayer-part.FirstLayer))
		if part.Output {
			b.WriteString("o")
		}
		b.WriteString("]")
	}
	return b.String()
}

func TestFit(t *testing.T) {
	big := []Device{{Index: 0, Name: "big", FreeBytes: 80 * gib}}
	two := []Device{{Index: 0, Name: "a", FreeBytes: 6 * gib}, {Index: 1, Name: "b", FreeBytes: 6 * gib}}
	uneven := []Device{{Index: 0, Name: "a", FreeBytes: 12 * gib}, {Index: 1, Name: "b", FreeBytes: 4 * gib}}
	small := []Device{{Index: 0, Name: "small", FreeBytes: 5 * gib}}
	tests := []struct {
		name    string
		m       Model
		devs    []Device
		r       Request
		want    string
		ctx     int
		lowered bool
		wantErr string
	}{
		{"all fit", model(8, kib), big, Request{GPULayers: -1, Context: 4096, Slots: 1, Margin: gib}, "A[########o]", 4096, false, ""},
		{"explicit count", model(8, kib), big, Request{GPULayers: 3, Context: 4096, Slots: 1}, "cpu[#####]A[###o]", 4096, false, ""},
		{"count over layers", model(8, kib), big, Request{GPULayers: 99, Context: 4096, Slots: 1}, "A[########o]", 4096, false, ""},
		{"zero layers", model(8, kib), big, Request{GPULayers: 0, Context: 4096, Slots: 1}, "cpu[########o]", 4096, false, ""},
		{"no devices, auto", model(4, kib), nil, Request{GPULayers: -1, Context: 4096, Slots: 1}, "cpu[####o]", 4096, false, ""},
		// 5 GiB free, 1 GiB margin: work 0.25 + output 0.5 + 3 layers of 1 GiB + 4 MiB KV each fits, 4 do not.
		{"auto fewer layers", model(8, kib), small, Request{GPULayers: -1, Context: 4096, Slots: 1, Margin: gib, ContextFixed: true}, "cpu[#####]A[###o]", 4096, false, ""},
		// Two 6 GiB devices split by free memory: 4 layers each.
		{"two devices by free memory", model(8, kib), two, Request{GPULayers: -1, Context: 1024, Slots: 1}, "A[####]B[####o]", 1024, false, ""},
		{"explicit split 3,1", model(8, kib), uneven, Request{GPULayers: -1, Split: []float64{3, 1}, Context: 1024, Slots: 1}, "A[######]B[##o]", 1024, false, ""},
		{"fits on the larger of two", model(8, kib), uneven, Request{GPULayers: -1, Context: 1024, Slots: 1}, "A[########o]", 1024, false, ""},
		{"split by free 12:4", model(12, kib), uneven, Request{GPULayers: -1, Context: 1024, Slots: 1}, "A[#########]B[###o]", 1024, false, ""},
		{"zero share skips a device", model(4, kib), two, Request{GPULayers: -1, Split: []float64{0, 1}, Context: 1024, Slots: 1}, "B[####o]", 1024, false, ""},
		{"tiny share rounds to nothing", model(4, kib), []Device{{Name: "a", FreeBytes: 80 * gib}, {Index: 1, Name: "b", FreeBytes: 80 * gib}}, Request{GPULayers: -1, Split: []float64{1, 0.01}, Context: 1024, Slots: 1}, "A[####o]", 1024, false, ""},
		// Each layer's KV at 8192 positions and 4 slots is 32 GiB: the
		// context is halved until all 8 layers fit in 79 GiB: at 2048, 64
		// GiB of KV and 9.25 GiB of weights and buffers.
		{"context lowered", model(8, mib), big, Request{GPULayers: -1, Context: 8192, Slots: 4, Margin: gib}, "A[########o]", 2048, true, ""},
		{"context fixed keeps it", model(8, mib), big, Request{GPULayers: -1, Context: 8192, Slots: 4, Margin: gib, ContextFixed: true}, "cpu[######]A[##o]", 8192, false, ""},
		// Sliding layers cap their cache: the same request fits with 7 of 8 sliding.
		{"sliding windows", model(8, mib, 0, 1, 2, 3, 4, 5, 6), big, Request{GPULayers: -1, Context: 8192, Slots: 4, Margin: gib, ContextFixed: true}, "A[########o]", 8192, false, ""},
		{"explicit count too big", model(8, kib), small, Request{GPULayers: 8, Context: 4096, Slots: 1, Margin: gib}, "", 0, false, "on cuda:0 (small), which has 5.0 GiB free"},
		{"split length", model(8, kib), two, Request{GPULayers: -1, Split: []float64{1}, Context: 1024}, "", 0, false, "1 entries for 2 GPUs"},
		{"all-zero split", model(8, kib), two, Request{GPULayers: -1, Split: []float64{0, 0}, Context: 1024}, "", 0, false, "share of 0"},
		{"gpu layers without gpu", model(8, kib), nil, Request{GPULayers: 2, Context: 1024}, "", 0, false, "no GPU"},
		{"no layers", Model{}, big, Request{GPULayers: -1, Context: 1024}, "", 0, false, "no layers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Fit(tc.m, tc.devs, tc.r)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := layout(p); got != tc.want {
				t.Errorf("layout %s, want %s (%s)", got, tc.want, p)
			}
			if p.Context != tc.ctx || p.Lowered != tc.lowered {
				t.Errorf("context %d lowered %v, want %d %v", p.Context, p.Lowered, tc.ctx, tc.lowered)
			}
			// Parts cover every layer once, in order.
			at := 0
			for _, part := range p.Parts {
				if part.FirstLayer != at || part.EndLayer <= part.FirstLayer && part.Device >= 0 {
					t.Errorf("part %+v after layer %d", part, at)
				}
				at = part.EndLayer
			}
			if at != len(tc.m.LayerBytes) {
				t.Errorf("parts end at %d of %d layers", at, len(tc.m.LayerBytes))
			}
		})
	}
}

func TestPlanString(t *testing.T) {
	devs := []Device{{Index: 0, Name: "NVIDIA H100", FreeBytes: 80 * gib}, {Index: 1, Name: "NVIDIA H200", FreeBytes: 140 * gib}}
	p, err := Fit(model(8, kib), devs, Request{GPULayers: 6, Split: []float64{1, 1}, Context: 2048, Slots: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := "layers 0-1 on cpu; 2-4 on cuda:0 NVIDIA H100 (3.3 GiB of 80.0 GiB free); 5-7 and output on cuda:1 NVIDIA H200 (3.8 GiB of 140.0 GiB free) (context 2048)"
	if got := p.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if p.GPULayers() != 6 {
		t.Errorf("GPULayers = %d", p.GPULayers())
	}
}

func TestParseSplit(t *testing.T) {
	tests := []struct {
		in      string
		want    []float64
		wantErr bool
	}{
		{"", nil, false},
		{"3,1", []float64{3, 1}, false},
		{" 0.5 , 0.5 ", []float64{0.5, 0.5}, false},
		{"1,x", nil, true},
		{"1,-1", nil, true},
		{"1abc", nil, true},
		{"NaN", nil, true},
		{"Inf", nil, true},
		{"1,,1", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseSplit(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseSplit(%q) err = %v", tc.in, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("ParseSplit(%q) = %v, want %v", tc.in, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ParseSplit(%q) = %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

// FuzzParseSplit: any input gives shares that are finite and
// non-negative, or an error naming the flag; never a panic.
func FuzzParseSplit(f *testing.F) {
	for _, s := range []string{"", "3,1", "0.5,0.5", "1,,1", "-1", "NaN", "1e400", " 2 , 3 ", "0,0,0,1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		shares, err := ParseSplit(s)
		if err != nil {
			if !strings.Contains(err.Error(), "--tensor-split") {
				t.Fatalf("error %q does not name the flag", err)
			}
			return
		}
		for _, v := range shares {
			if !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("ParseSplit(%q) gave share %v", s, v)
			}
		}
	})
}
