package cuda

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"unsafe"
)

// Block tracing is a measuring aid for what ncu cannot show: how the
// launches of a replayed graph overlap under programmatic dependent
// launch. With WEFT_CUDA_TRACE=1 the kernels are compiled with
// WEFT_TRACE (kernels.cu's PDL): thread 0 of every block records the
// launch's %gridid, the %globaltimer reading before its dependency wait
// and after it, its multiprocessor and the reading when it leaves. The
// records of one decode step, grouped by launch and put in the order of
// the captured launches, say when each launch's blocks were placed,
// released and done. The recording costs an atomic and four stores a
// block, so the times are close to, not equal to, an untraced run's.

// traceOn reports whether WEFT_CUDA_TRACE=1 asks for block tracing.
func traceOn() bool { return os.Getenv("WEFT_CUDA_TRACE") == "1" }

// traceCap is the records the trace buffer holds (32 MiB): a decode step
// of the 8B shape writes about 150,000.
const traceCap = 1 << 20

// tracer is the device side of block tracing.
type tracer struct {
	buf   uint64   // traceCap records of four words
	count uint64   // the address of weft_trace_n
	phase uint64   // the address of weft_phase: kernels.cu's PHASE stamps
	names []string // the kernels of the last captured graph, in launch order
}

// newTracer allocates the trace buffer and points the module's weft_trace
// and weft_trace_cap at it.
func newTracer(d *driverAPI, module uintptr) (*tracer, error) {
	var ptr, capAt, count, phase, size uint64
	for _, g := range []struct {
		name string
		at   *uint64
	}{{"weft_trace", &ptr}, {"weft_trace_cap", &capAt}, {"weft_trace_n", &count}, {"weft_phase", &phase}} {
		if r := d.cuModuleGetGlobal(g.at, &size, module, g.name); r != 0 {
			return nil, fmt.Errorf("tracing: the module has no %s (%w)", g.name, d.err(r))
		}
	}
	t := &tracer{count: count, phase: phase}
	if r := d.cuMemAlloc(&t.buf, traceCap*32); r != 0 {
		return nil, fmt.Errorf("tracing: allocating %d records: %w", traceCap, d.err(r))
	}
	c := uint32(traceCap)
	if r := d.cuMemcpyHtoD(ptr, unsafe.Pointer(&t.buf), 8); r != 0 {
		d.cuMemFree(t.buf)
		return nil, fmt.Errorf("tracing: %w", d.err(r))
	}
	if r := d.cuMemcpyHtoD(capAt, unsafe.Pointer(&c), 4); r != 0 {
		d.cuMemFree(t.buf)
		return nil, fmt.Errorf("tracing: %w", d.err(r))
	}
	return t, nil
}

// traceSync makes the context current (the caller unlocks its OS
// thread) and waits for the device, where tracing is on.
func (b *Backend) traceSync() (*driverAPI, error) {
	if b.trace == nil {
		return nil, fmt.Errorf("cuda: tracing is off (WEFT_CUDA_TRACE=1 turns it on)")
	}
	if err := b.current(); err != nil {
		return nil, err
	}
	d := b.drv
	if r := d.cuCtxSynchronize(); r != 0 {
		return nil, fmt.Errorf("cuda: %w", d.err(r))
	}
	return d, nil
}

// traceReset empties the trace: the blocks of launches after it record
// from the start of the buffer.
func (b *Backend) traceReset() error {
	defer runtime.UnlockOSThread()
	d, err := b.traceSync()
	if err != nil {
		return err
	}
	if r := d.cuMemsetD8(b.trace.count, 0, 4); r != 0 {
		return fmt.Errorf("cuda: %w", d.err(r))
	}
	if r := d.cuMemsetD8(b.trace.phase, 0, 8*tracePhases); r != 0 {
		return fmt.Errorf("cuda: %w", d.err(r))
	}
	return nil
}

// tracePhases is the length of weft_phase.
const tracePhases = 8

// tracePhase returns the PHASE stamps (%globaltimer, ns; 0 where none was
// recorded) of the last block (0, 0) to pass them since traceReset: in
// this build, the decode attention's (attention.cu).
func (b *Backend) tracePhase() ([]uint64, error) {
	defer runtime.UnlockOSThread()
	d, err := b.traceSync()
	if err != nil {
		return nil, err
	}
	ph := make([]uint64, tracePhases)
	if r := d.cuMemcpyDtoH(unsafe.Pointer(&ph[0]), b.trace.phase, 8*tracePhases); r != 0 {
		return nil, fmt.Errorf("cuda: %w", d.err(r))
	}
	return ph, nil
}

// traceRead waits for the device and returns the records written since
// traceReset, and the kernels of the last captured graph in launch order.
func (b *Backend) traceRead() ([]traceRecord, []string, error) {
	defer runtime.UnlockOSThread()
	d, err := b.traceSync()
	if err != nil {
		return nil, nil, err
	}
	var n uint32
	if r := d.cuMemcpyDtoH(unsafe.Pointer(&n), b.trace.count, 4); r != 0 {
		return nil, nil, fmt.Errorf("cuda: %w", d.err(r))
	}
	if n > traceCap {
		return nil, nil, fmt.Errorf("cuda: %d blocks traced, more than the buffer's %d", n, traceCap)
	}
	if n == 0 {
		return nil, b.trace.names, nil
	}
	words := make([]uint64, 4*n)
	if r := d.cuMemcpyDtoH(unsafe.Pointer(&words[0]), b.trace.buf, uint64(len(words))*8); r != 0 {
		return nil, nil, fmt.Errorf("cuda: %w", d.err(r))
	}
	recs := make([]traceRecord, n)
	for i := range recs {
		w := words[4*i:]
		recs[i] = traceRecord{grid: w[0], start: w[1], released: w[2], sm: int(w[3] >> 56), end: fullTime(w[2], w[3])}
	}
	return recs, b.trace.names, nil
}

// fullTime restores a block's end time from its record's last word, which
// keeps only the low 56 bits of %globaltimer (the top 8 hold the
// multiprocessor; the timer counts ns since 1970 and needs 61), by taking
// the high bits from the release time, which precedes the end by far less
// than 2^56 ns.
func fullTime(released, word uint64) uint64 {
	const mask = 1<<56 - 1
	t := released&^mask | word&mask
	if t < released {
		t += 1 << 56
	}
	return t
}

// traceRecord is one block's record: its launch, the %globaltimer readings
// (ns) before and after its dependency wait and when it left, and its
// multiprocessor.
type traceRecord struct {
	grid, start, released, end uint64
	sm                         int
}

// traceLaunch summarizes one launch's blocks; times are ns from the
// first block's start of the whole trace.
type traceLaunch struct {
	kernel          string
	blocks, sms     int // blocks traced, multiprocessors they ran on
	maxPerSM        int // the most blocks on one multiprocessor
	placed          int64
	released, first int64 // the first block released, the first block done
	done            int64 // the last block done
	// doneFewer is the last block done on a multiprocessor that held
	// fewer than maxPerSM of the launch's blocks (-1: none did). Far
	// below done, the launch's end is set by the multiprocessors that
	// got one block more than others.
	doneFewer int64
}

// summarizeTrace groups records by launch, orders the launches by their
// first block's start (the order of the graph's launches: under PDL a
// launch's blocks are placed only once every block of the one before it
// has started) and names them by names, which must have as many entries
// as there are launches.
func summarizeTrace(recs []traceRecord, names []string) ([]traceLaunch, error) {
	t0, byGrid, grids, err := launchesOf(recs, names)
	if err != nil {
		return nil, err
	}
	out := make([]traceLaunch, 0, len(grids))
	for i, g := range grids {
		rs := byGrid[g]
		l := traceLaunch{kernel: names[i], blocks: len(rs), placed: int64(rs[0].start - t0), released: int64(rs[0].released - t0),
			first: int64(rs[0].end - t0), done: int64(rs[0].end - t0)}
		perSM := map[int]int{}
		for _, r := range rs {
			perSM[r.sm]++
			l.placed = min(l.placed, int64(r.start-t0))
			l.released = min(l.released, int64(r.released-t0))
			l.first = min(l.first, int64(r.end-t0))
			l.done = max(l.done, int64(r.end-t0))
		}
		l.sms = len(perSM)
		for _, n := range perSM {
			l.maxPerSM = max(l.maxPerSM, n)
		}
		l.doneFewer = -1
		for _, r := range rs {
			if perSM[r.sm] < l.maxPerSM {
				l.doneFewer = max(l.doneFewer, int64(r.end-t0))
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// launchesOf checks the records and groups them by launch: the trace's
// first start, each launch's records, and the launches in the order of
// their first block's start, one for each of names.
func launchesOf(recs []traceRecord, names []string) (t0 uint64, byGrid map[uint64][]traceRecord, grids []uint64, err error) {
	if len(recs) == 0 {
		return 0, nil, nil, fmt.Errorf("no blocks traced")
	}
	t0 = recs[0].start
	byGrid = map[uint64][]traceRecord{}
	placed := map[uint64]uint64{}
	for _, r := range recs {
		if r.end < r.released || r.released < r.start {
			return 0, nil, nil, fmt.Errorf("block of launch %d on multiprocessor %d: times %d, %d, %d out of order", r.grid, r.sm, r.start, r.released, r.end)
		}
		t0 = min(t0, r.start)
		if p, ok := placed[r.grid]; !ok || r.start < p {
			placed[r.grid] = r.start
		}
		byGrid[r.grid] = append(byGrid[r.grid], r)
	}
	if len(byGrid) != len(names) {
		return 0, nil, nil, fmt.Errorf("%d launches traced, %d in the captured graph", len(byGrid), len(names))
	}
	grids = slices.Collect(maps.Keys(byGrid))
	slices.SortFunc(grids, func(a, b uint64) int { return cmp.Compare(placed[a], placed[b]) })
	return t0, byGrid, grids, nil
}

// dumpTrace writes every block's record as a line "launch kernel sm
// placed released end" (ns from the trace's first start; launches
// numbered in summarizeTrace's order), for analyses the summary does not
// make (which multiprocessors end a launch late, say).
func dumpTrace(w io.Writer, recs []traceRecord, names []string) error {
	t0, _, grids, err := launchesOf(recs, names)
	if err != nil {
		return err
	}
	index := map[uint64]int{}
	for i, g := range grids {
		index[g] = i
	}
	for _, r := range recs {
		i := index[r.grid]
		if _, err := fmt.Fprintf(w, "%d %s %d %d %d %d\n", i, names[i], r.sm, r.start-t0, r.released-t0, r.end-t0); err != nil {
			return err
		}
	}
	return nil
}

// writeTrace prints one line a launch (µs from the trace's start: when
// its first block was placed and released, its first and last block
// done, the last done on a multiprocessor with fewer than maxSM of its
// blocks; how long after the launch before it ended it ended) and then, per
// kernel, the launches and the sum of those increments: what each kernel
// class added to the step.
func writeTrace(w io.Writer, ls []traceLaunch) {
	us := func(ns int64) float64 { return float64(ns) / 1000 }
	fmt.Fprintf(w, "%4s %-22s %6s %4s %5s %9s %9s %9s %9s %9s %8s\n", "#", "kernel", "blocks", "sms", "maxSM", "placed", "released", "first", "done",
		"fewer", "added")
	type sum struct {
		n     int
		added int64
	}
	sums := map[string]*sum{}
	var order []string
	prev := int64(0)
	for i, l := range ls {
		added := l.done - prev
		if i == 0 {
			added = l.done - l.placed
		}
		prev = max(prev, l.done)
		fewer := "-"
		if l.doneFewer >= 0 {
			fewer = fmt.Sprintf("%.2f", us(l.doneFewer))
		}
		fmt.Fprintf(w, "%4d %-22s %6d %4d %5d %9.2f %9.2f %9.2f %9.2f %9s %8.2f\n", i, l.kernel, l.blocks, l.sms, l.maxPerSM,
			us(l.placed), us(l.released), us(l.first), us(l.done), fewer, us(added))
		s := sums[l.kernel]
		if s == nil {
			s = &sum{}
			sums[l.kernel] = s
			order = append(order, l.kernel)
		}
		s.n++
		s.added += added
	}
	slices.SortStableFunc(order, func(a, b string) int { return int(sums[b].added - sums[a].added) })
	fmt.Fprintf(w, "\n%-22s %8s %10s\n", "kernel", "launches", "added µs")
	for _, k := range order {
		fmt.Fprintf(w, "%-22s %8d %10.1f\n", k, sums[k].n, us(sums[k].added))
	}
}
