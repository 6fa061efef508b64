package cuda

import (
	"strings"
	"testing"
)

// TestSummarizeTrace checks the grouping of block records into launches:
// ordered by their first block's placement whatever the record order,
// named in that order, with their blocks, multiprocessors and times.
func TestSummarizeTrace(t *testing.T) {
	// Launch 7 (placed first) has three blocks, two on multiprocessor 1;
	// launch 3 (placed second, while 7 still runs) has two.
	recs := []traceRecord{
		{grid: 3, start: 1_500, released: 4_000, end: 6_000, sm: 0},
		{grid: 7, start: 1_000, released: 1_200, end: 3_900, sm: 1},
		{grid: 7, start: 1_100, released: 1_300, end: 3_000, sm: 1},
		{grid: 3, start: 1_600, released: 4_100, end: 5_000, sm: 2},
		{grid: 7, start: 1_050, released: 1_250, end: 3_500, sm: 2},
	}
	ls, err := summarizeTrace(recs, []string{"rmsnorm_q8", "matvec_q4_0"})
	if err != nil {
		t.Fatal(err)
	}
	want := []traceLaunch{
		// Multiprocessor 2 held one of the norm's blocks, 1 two.
		{kernel: "rmsnorm_q8", blocks: 3, sms: 2, maxPerSM: 2, placed: 0, released: 200, first: 2_000, done: 2_900, doneFewer: 2_500},
		{kernel: "matvec_q4_0", blocks: 2, sms: 2, maxPerSM: 1, placed: 500, released: 3_000, first: 4_000, done: 5_000, doneFewer: -1},
	}
	if len(ls) != len(want) {
		t.Fatalf("%d launches, want %d", len(ls), len(want))
	}
	for i := range want {
		if ls[i] != want[i] {
			t.Errorf("launch %d: %+v, want %+v", i, ls[i], want[i])
		}
	}
	// dumpTrace: a line a block, launches numbered as summarizeTrace
	// orders them, times from the first start.
	var d strings.Builder
	if err := dumpTrace(&d, recs, []string{"rmsnorm_q8", "matvec_q4_0"}); err != nil {
		t.Fatal(err)
	}
	if want := "1 matvec_q4_0 0 500 3000 5000\n0 rmsnorm_q8 1 0 200 2900\n0 rmsnorm_q8 1 100 300 2000\n" +
		"1 matvec_q4_0 2 600 3100 4000\n0 rmsnorm_q8 2 50 250 2500\n"; d.String() != want {
		t.Errorf("dump:\n%s\nwant:\n%s", d.String(), want)
	}
	if err := dumpTrace(&d, recs, []string{"one"}); err == nil {
		t.Error("dump with one name for two launches: no error")
	}
	var b strings.Builder
	writeTrace(&b, ls)
	// The "fewer" column: 2.50 µs for the norm, none for the product.
	lines := strings.Split(b.String(), "\n")
	for i, want := range []string{"2.50", "-"} {
		if f := strings.Fields(lines[1+i]); len(f) != 11 || f[9] != want {
			t.Errorf("launch line %q: fewer column, want %s", lines[1+i], want)
		}
	}
	// The norm adds its whole span, the product what it ran past it.
	for _, line := range []string{"rmsnorm_q8                    1        2.9", "matvec_q4_0                   1        2.1"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("summary lacks %q:\n%s", line, b.String())
		}
	}

	for _, tc := range []struct {
		recs  []traceRecord
		names []string
		err   string
	}{
		{nil, nil, "no blocks"},
		{recs, []string{"one"}, "2 launches traced, 1 in the captured graph"},
		{[]traceRecord{{grid: 1, start: 5, released: 4, end: 6}}, []string{"x"}, "out of order"},
	} {
		if _, err := summarizeTrace(tc.recs, tc.names); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want %q", tc.recs, err, tc.err)
		}
	}
}

// The kernel keeps the low 56 bits of the end time under the
// multiprocessor number; fullTime must restore the whole reading, also
// when the low bits wrap between release and end.
func TestFullTime(t *testing.T) {
	const mask = 1<<56 - 1
	for _, c := range []struct {
		released, end uint64
		sm            uint64
	}{
		{1795389968973611200, 1795389968973613000, 126},
		{1795389968973611200, 1795389968973611200, 0},
		{25<<56 - 10, 25<<56 + 20, 131},
		{5, 9, 255},
	} {
		if got := fullTime(c.released, c.sm<<56|c.end&mask); got != c.end {
			t.Errorf("fullTime(%d, sm %d, end %d) = %d", c.released, c.sm, c.end, got)
		}
	}
}
