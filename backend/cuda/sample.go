package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/weftlm/weft/backend"
)

// Token draws on the device (sample.cu): after the plan has written the
// selected rows' logits, draw takes the best Gumbel-perturbed logit of each
// vocabulary chunk in a block, and the last block of a row the best chunk,
// so a decode step copies one int32 a row back instead of [rows, vocab]
// floats (513 KB a row for a 128k vocabulary).

// drawChunk is the vocabulary a draw block covers (at most drawMaxChunk):
// enough blocks to spread a row over the device, few enough for the row's
// last block to scan. 512 was faster than 2,048 for every kind of draw (TestDrawCost, H100:
// greedy 6.9 against 7.7 µs, temperature 8.0 against 11.1, top-k 40 22.1
// against 24.0). A variable so tests can cover many chunks with a small
// vocabulary.
var drawChunk = 512

// drawState is an exec's device memory and launch arguments for draws,
// allocated on the first RunSampled. The parameters (seeds, steps and
// temperatures) follow the batch in meta (exec.drawAt).
type drawState struct {
	part   uint64 // device: float2 [MaxRows, chunks]
	cands  uint64 // device: uint64 [MaxRows, chunks, backend.MaxTopK], the chunks' best logits of a top-k row
	ids    uint64 // device: int32 [MaxRows]
	done   uint64 // device: uint32 [MaxRows], each row's blocks finished (0 between launches)
	groups uint64 // device: uint32 [MaxRows, groups of drawGroup chunks], a top-k row's chunks finished (0 between launches)
	nst    uint64 // device: sample.cu's nucleus [MaxRows], a nucleus row's cut
	hist   uint64 // device: uint64 [MaxRows, nucBuckets], a nucleus row's masses by digit (0 between launches)
	win    uint64 // device: int32 [MaxRows, backend.MaxWindow], the penalty windows (a ring from wnext)
	bias   uint64 // device: biasEntry [MaxRows, backend.MaxBias], the logit biases
	chunks int
	fn     uintptr
	args   [23]uint64 // draw's arguments
	params [23]uintptr
	// adjust's launch, before the others where a row has a logit bias or
	// penalties; saved: int2 [MaxRows, savedEntries], the logits it
	// changed, before it changed them.
	adjFn     uintptr
	adjArgs   [12]uint64
	adjParams [12]uintptr
	saved     uint64
	// The log-probabilities' launches (outLogprobs): logprob before the
	// others, logprob_end after the draw. lpPart: double2 [MaxRows,
	// chunks]; recs: sample.cu's lp_rec [MaxRows, 2] where the records do
	// not go to mapped host memory (drawHost.lpDev).
	lpFn, lpEndFn uintptr
	lpArgs        [11]uint64
	lpParams      [11]uintptr
	lpEndArgs     [10]uint64
	lpEndParams   [10]uintptr
	lpPart, recs  uint64
	// The nucleus rows' launches before draw: nucleus_max, then
	// nucleus_pass for each digit of the cut.
	nucFns    [1 + nucDigits]uintptr
	nucArgs   [1 + nucDigits][13]uint64
	nucParams [1 + nucDigits][13]uintptr
	// nucleus_pass at level 0 reading the row's largest logit from the
	// slots, for outFoldedNucleus (set with folds).
	nucFoldArgs   [13]uint64
	nucFoldParams [13]uintptr
	// The draw folded into the output product (outFolded,
	// outFoldedNucleus): fold is the twin of launch foldAt, the one that
	// computes a one-row batch's logits (-1: the plan has no such launch,
	// and nothing folds), pick the draw_fold after it. slots: sample.cu's
	// FOLD_SLOTS keys, FOLD_STRIDE apart (0 between launches).
	fold       launch
	foldAt     int
	foldArgs   [14]uint64
	foldParams [14]uintptr
	pick       launch
	pickArgs   [7]uint64
	pickParams [7]uintptr
	slots      uint64
}

var errNoCandidate = errors.New("cuda: every logit of a row is NaN or -Inf: no token to draw")

// RunSampled implements backend.Sampler: Run, then each selected row's
// token drawn on the device by s[i] (sample.SampleGumbel's draw, or
// sample.SampleTopK's for a row with a top-k).
func (e *exec) RunSampled(b *backend.Batch, s []backend.Sampling, out []int32) error {
	if len(out) != len(b.Selected) {
		return fmt.Errorf("cuda: %d selected rows and %d outputs", len(b.Selected), len(out))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if e.chain.inFlight() > 0 {
		return errInFlight
	}
	if err := e.stageDraws(b, s); err != nil {
		return err
	}
	sel := len(b.Selected)
	if _, err := e.replay(b, true, false); err != nil {
		return err
	}
	dh := &e.drawHost
	if dh.drawnDev != 0 {
		// The draw kernel stored the draws in dh.drawn.
		if r := e.sys.call(e.be.drv.ctxSync, 0); r != 0 {
			return fmt.Errorf("cuda: running the plan: %w", e.be.drv.err(r))
		}
		for i, x := range s {
			out[i] = dh.drawnAt(i, x.Step)
		}
	} else {
		ids := dh.ids[0][:sel]
		if err := e.fetch(unsafe.Pointer(&ids[0]), e.draw.ids, 4*sel); err != nil {
			return err
		}
		copy(out, ids)
	}
	lp := e.drawOut >= outLogprobs
	if lp && dh.lpDev == 0 {
		recs := dh.lp[0][:2*sel]
		if err := e.fetch(unsafe.Pointer(&recs[0]), e.draw.recs, lpRecBytes*2*sel); err != nil {
			return err
		}
	}
	for i, x := range s {
		e.lpSteps[i] = x.Step
	}
	e.handLogprobs(dh.lp[0], e.lpSteps[:sel], dh.lpn[:sel], lp)
	return checkDraws(out, b.Selected)
}

// handLogprobs makes the log-probabilities of a step's rows those
// Logprobs reports, the draws handed out now: on says the step took
// them, into recs (drawHost.lp's), row i's at 2i + (steps[i] & 1); top
// is each row's TopLogprobs or -1.
func (e *exec) handLogprobs(recs []lpRec, steps []uint64, top []int32, on bool) {
	if !on {
		for i := range top {
			e.lpTop[i] = -1
		}
		return
	}
	copy(e.lpTop, top)
	for i, t := range steps {
		e.lpRecs[i] = recs[2*i+int(t&1)]
	}
}

// Logprobs implements backend.LogprobSampler, from the records of the
// draws handed out last (handLogprobs): log-probabilities are the raw
// logits less their row's log-sum-exp, in float64, as
// sample.TokenLogProbs computes them. A row that asked for none has none.
func (e *exec) Logprobs(i int, top []backend.TokenLogprob) (float32, int) {
	if i < 0 || i >= len(e.lpTop) || e.lpTop[i] < 0 {
		return float32(math.NaN()), 0
	}
	r := &e.lpRecs[i]
	lp := float32(math.Inf(-1))
	if r.drawn > lp {
		lp = float32(float64(r.drawn) - r.lse)
	}
	n := min(int(r.n), int(e.lpTop[i]), len(top))
	for k := range n {
		top[k] = backend.TokenLogprob{ID: r.ids[k], Logprob: float32(float64(r.vals[k]) - r.lse)}
	}
	return lp, n
}

// stageDraws checks a batch to draw from by s, sets the draws up on first
// use and stages their parameters on the host, for the batch's copy to
// take along. The caller has locked its OS thread.
func (e *exec) stageDraws(b *backend.Batch, s []backend.Sampling) error {
	if e.closed {
		return errClosed
	}
	if err := e.p.Validate(b); err != nil {
		return err
	}
	switch {
	case b.HiddenOnly:
		return errors.New("cuda: a hidden-state batch has no logits to draw from")
	case len(s) != len(b.Selected):
		return fmt.Errorf("cuda: %d selected rows and %d samplings", len(b.Selected), len(s))
	}
	for i, x := range s {
		if err := x.Check(); err != nil {
			return fmt.Errorf("cuda: row %d: %w", i, err)
		}
	}
	if e.be.closed {
		return errBackendClosed
	}
	if e.draw == nil {
		err := e.be.current()
		runtime.UnlockOSThread() // current locks once more
		if err != nil {
			return err
		}
		if err := e.newDrawState(); err != nil {
			return err
		}
	}
	dh := &e.drawHost
	e.drawWindows, e.drawBias = false, false
	lp := false
	for i, x := range s {
		dh.temp[i], dh.seed[i], dh.step[i] = x.Temperature, x.Seed, x.Step
		dh.topK[i], dh.topP[i], dh.minP[i] = int32(x.TopK), x.TopP, x.MinP
		dh.blen[i] = int32(len(x.BiasIDs))
		for j, id := range x.BiasIDs {
			if int(id) >= e.p.Vocab {
				return fmt.Errorf("cuda: row %d: logit bias token %d outside the vocabulary [0, %d)", i, id, e.p.Vocab)
			}
			dh.bias[i*backend.MaxBias+j] = biasEntry{id, x.BiasValues[j]}
		}
		e.drawBias = e.drawBias || len(x.BiasIDs) > 0
		dh.lpn[i] = -1
		if x.Logprobs {
			dh.lpn[i] = int32(x.TopLogprobs)
			lp = true
		}
		dh.wsize[i], dh.wlen[i], dh.wnext[i] = 0, 0, 0
		if !x.Penalizes() {
			continue
		}
		e.drawWindows = true
		// The window, oldest first; the next draw goes after it, or over
		// its oldest token once it is full.
		for _, t := range x.Recent {
			if t < 0 || int(t) >= e.p.Vocab {
				return fmt.Errorf("cuda: row %d: penalty window token %d outside the vocabulary [0, %d)", i, t, e.p.Vocab)
			}
		}
		dh.rep[i], dh.pres[i], dh.freq[i] = cmp.Or(x.RepeatPenalty, 1), x.PresencePenalty, x.FrequencyPenalty
		dh.wsize[i], dh.wlen[i], dh.wnext[i] = int32(x.Window), int32(len(x.Recent)), int32(len(x.Recent)%x.Window)
		copy(dh.win[i*backend.MaxWindow:], x.Recent)
	}
	e.drawOut = drawOut(s)
	switch {
	case lp:
		e.drawOut += outLogprobs
	case len(s) == 1 && e.draw.foldAt >= 0:
		switch {
		case e.drawOut == outDrawn && !(s[0].Temperature > 0):
			e.drawOut = outFolded
		case e.drawOut == outNucleus:
			e.drawOut = outFoldedNucleus
		}
	}
	return nil
}

// launchDraws queues the draws of the sel selected rows' logits on
// stream, for output out: an out from outLogprobs on launches logprob,
// then the launches of out - outLogprobs, then logprob_end; outAdjusted
// and outAdjustedNucleus first change the logits of rows with a bias or
// penalties, outNucleus and outAdjustedNucleus then find the cuts of the
// rows that draw as sample.SampleNucleus. They follow the plan's last
// launch without programmatic dependent launch: launched early, their
// blocks would hold room on the multiprocessors that the output
// product's blocks need. outFolded's one warp (draw_fold) follows it by
// programmatic dependent launch where pdl is set; outFoldedNucleus has
// no nucleus_max (its first nucleus_pass reads the largest logit from
// the slots).
func (e *exec) launchDraws(sel, out int, stream uintptr, pdl bool) error {
	ds, d, c := e.draw, e.be.drv, &e.sys
	if out >= outLogprobs {
		*c = callArgs{ds.lpFn, uintptr(ds.chunks), uintptr(sel), 1, drawThreads, 1, 1, 0, stream, uintptr(unsafe.Pointer(&ds.lpParams[0])), 0}
		if r := c.call(d.launchKernel, 11); r != 0 {
			return fmt.Errorf("cuda: launching the log-probabilities: %w", d.err(r))
		}
		if err := e.launchDraws(sel, out-outLogprobs, stream, pdl); err != nil {
			return err
		}
		*c = callArgs{ds.lpEndFn, uintptr(sel), 1, 1, 32, 1, 1, 0, stream, uintptr(unsafe.Pointer(&ds.lpEndParams[0])), 0}
		if r := c.call(d.launchKernel, 11); r != 0 {
			return fmt.Errorf("cuda: launching the drawn tokens' log-probabilities: %w", d.err(r))
		}
		return nil
	}
	if out == outFolded {
		if r := e.launch(&ds.pick, 1, sel, stream, pdl); r != 0 {
			return fmt.Errorf("cuda: launching the folded draw: %w", d.err(r))
		}
		return nil
	}
	if out == outAdjusted || out == outAdjustedNucleus {
		*c = callArgs{ds.adjFn, uintptr(sel), 1, 1, drawThreads, 1, 1, 0, stream, uintptr(unsafe.Pointer(&ds.adjParams[0])), 0}
		if r := c.call(d.launchKernel, 11); r != 0 {
			return fmt.Errorf("cuda: launching the logit biases and penalties: %w", d.err(r))
		}
	}
	if out == outNucleus || out == outAdjustedNucleus || out == outFoldedNucleus {
		for i, fn := range ds.nucFns {
			params := &ds.nucParams[i][0]
			if out == outFoldedNucleus {
				if i == 0 {
					continue // the output product's twin took the largest logit
				}
				if i == 1 {
					params = &ds.nucFoldParams[0]
				}
			}
			*c = callArgs{fn, uintptr(ds.chunks), uintptr(sel), 1, drawThreads, 1, 1, 0, stream, uintptr(unsafe.Pointer(params)), 0}
			if r := c.call(d.launchKernel, 11); r != 0 {
				return fmt.Errorf("cuda: launching the nucleus draws' cuts: %w", d.err(r))
			}
		}
	}
	*c = callArgs{ds.fn, uintptr(ds.chunks), uintptr(sel), 1, drawThreads, 1, 1, 0, stream, uintptr(unsafe.Pointer(&ds.params[0])), 0}
	r := c.call(d.launchKernel, 11)
	runtime.KeepAlive(ds)
	if r != 0 {
		return fmt.Errorf("cuda: launching the draws: %w", d.err(r))
	}
	return nil
}

// drawOut is the output of a run drawing by s: outDrawn, or with the
// launches that a row needs where one draws as sample.SampleNucleus
// (outNucleus), changes its logits first (outAdjusted), or both.
func drawOut(s []backend.Sampling) int {
	nucleus, pen := false, false
	for _, x := range s {
		nucleus = nucleus || x.Nucleus()
		pen = pen || x.Adjusts() // an empty window too: IssueNext fills it
	}
	switch {
	case nucleus && pen:
		return outAdjustedNucleus
	case nucleus:
		return outNucleus
	case pen:
		return outAdjusted
	}
	return outDrawn
}

// drawing reports whether a run's output draws tokens.
func drawing(out int) bool { return out >= outDrawn }

// drawnAt is selected row i's draw at draw step step, where the draw
// kernel stored it (sample.cu's host).
func (dh *drawHost) drawnAt(i int, step uint64) int32 {
	return dh.drawn[2*i+int(step&1)]
}

// checkDraws reports a row of out without a token (selected says which
// batch row it was; nil: row i is the i-th).
func checkDraws(out, selected []int32) error {
	for i, id := range out {
		if id < 0 {
			row := int32(i)
			if selected != nil {
				row = selected[i]
			}
			return fmt.Errorf("row %d: %w", row, errNoCandidate)
		}
	}
	return nil
}

// savedEntries is sample.cu's SAVED: adjust's saved logits a row.
const savedEntries = backend.MaxBias + backend.MaxWindow + 1

// drawThreads and drawGroup are sample.cu's DRAW_THREADS and DRAW_GROUP,
// drawMaxChunk its DRAW_LISTS * DRAW_TOPK; nucBuckets its NUC_BUCKETS,
// nucleusBytes the size of its nucleus, nucDigits the digits of a cut.
const (
	drawThreads  = 256
	drawGroup    = 8
	drawMaxChunk = 32 * 64
	nucBuckets   = 2048
	nucleusBytes = 32
	nucDigits    = 3
)

// newDrawState allocates the draws' device memory and binds the
// arguments of their launches (adjust, nucleus_max, nucleus_pass, draw);
// the context must be current.
func (e *exec) newDrawState() error {
	p := e.p
	fn, ok := e.be.funcs["draw"]
	fnMax, okMax := e.be.funcs["nucleus_max"]
	fnPass, okPass := e.be.funcs["nucleus_pass"]
	fnAdj, okAdj := e.be.funcs["adjust"]
	fnLp, okLp := e.be.funcs["logprob"]
	fnLpEnd, okLpEnd := e.be.funcs["logprob_end"]
	if !ok || !okMax || !okPass || !okAdj || !okLp || !okLpEnd {
		return errors.New("cuda: a draw kernel is missing")
	}
	if drawChunk > drawMaxChunk {
		return fmt.Errorf("cuda: draw chunks of %d tokens, more than the %d a block ranks", drawChunk, drawMaxChunk)
	}
	m := p.MaxRows
	ds := &drawState{chunks: (p.Vocab + drawChunk - 1) / drawChunk, fn: fn}
	for _, a := range []struct {
		ptr *uint64
		n   int
	}{{&ds.part, 8 * m * ds.chunks}, {&ds.cands, 8 * m * ds.chunks * backend.MaxTopK}, {&ds.ids, 4 * m}, {&ds.done, 4 * m},
		{&ds.groups, 4 * m * ((ds.chunks + drawGroup - 1) / drawGroup)}, {&ds.nst, nucleusBytes * m}, {&ds.hist, 8 * nucBuckets * m},
		{&ds.win, 4 * backend.MaxWindow * m}, {&ds.bias, 8 * backend.MaxBias * m},
		{&ds.saved, 8 * savedEntries * m}, {&ds.lpPart, 16 * m * ds.chunks}, {&ds.recs, lpRecBytes * 2 * m}} {
		ptr, err := e.alloc(uint64(a.n), "the draws")
		if err != nil {
			return err
		}
		*a.ptr = ptr
	}
	seed := e.meta + uint64(e.drawAt)
	field := func(k int) uint64 { return e.meta + uint64(4*(metaArrays+k*m)) }
	at := func(off int) uint64 { return seed + uint64(off*m) } // the parameters' arrays (drawHost)
	logits, temp, topK, topP, minP := e.bufs[p.Logits], at(16), at(20), at(24), at(28)
	vocab, chunk := uint64(uint32(p.Vocab)), uint64(uint32(drawChunk))
	wsize, wlen, wnext := at(44), at(48), at(52)
	ds.args = [23]uint64{
		ds.part, ds.cands, logits, temp, topK, topP, minP, seed, at(8), e.meta,
		vocab, chunk, ds.ids, ds.done, ds.groups, field(fieldTokens), field(fieldPos), e.drawHost.drawnDev, ds.nst,
		wsize, wlen, wnext, ds.win,
	}
	for i := range ds.args {
		ds.params[i] = uintptr(unsafe.Pointer(&ds.args[i]))
	}
	ds.adjFn = fnAdj
	ds.adjArgs = [12]uint64{logits, e.meta, at(32), at(36), at(40), wsize, wlen, ds.win, at(56), ds.bias, vocab, ds.saved}
	for i := range ds.adjArgs {
		ds.adjParams[i] = uintptr(unsafe.Pointer(&ds.adjArgs[i]))
	}
	ds.lpFn, ds.lpEndFn = fnLp, fnLpEnd
	recs := ds.recs
	if e.drawHost.lpDev != 0 {
		recs = e.drawHost.lpDev
	}
	ds.lpArgs = [11]uint64{logits, e.meta, at(60), at(8), vocab, chunk, ds.lpPart, ds.cands, ds.done, ds.groups, recs}
	for i := range ds.lpArgs {
		ds.lpParams[i] = uintptr(unsafe.Pointer(&ds.lpArgs[i]))
	}
	ds.lpEndArgs = [10]uint64{logits, e.meta, at(60), ds.ids, at(56), wsize, ds.saved, at(8), recs, vocab}
	for i := range ds.lpEndArgs {
		ds.lpEndParams[i] = uintptr(unsafe.Pointer(&ds.lpEndArgs[i]))
	}
	ds.nucFns[0] = fnMax
	ds.nucArgs[0] = [13]uint64{ds.part, logits, temp, topK, topP, minP, e.meta, vocab, chunk, ds.done, ds.nst}
	for level := range nucDigits {
		ds.nucFns[1+level] = fnPass
		ds.nucArgs[1+level] = [13]uint64{logits, temp, topK, topP, minP, e.meta, vocab, chunk, ds.done, ds.nst, ds.hist, uint64(level), 0}
	}
	for i := range ds.nucArgs {
		for j := range ds.nucArgs[i] {
			ds.nucParams[i][j] = uintptr(unsafe.Pointer(&ds.nucArgs[i][j]))
		}
	}
	ds.foldAt = -1
	if os.Getenv("WEFT_CUDA_FOLD_DRAW") != "0" {
		if err := e.newFolds(ds, at(8), field); err != nil {
			return err
		}
	}
	e.draw = ds
	return nil
}

// foldSlots and foldStride are sample.cu's FOLD_SLOTS and FOLD_STRIDE.
const (
	foldSlots  = 64
	foldStride = 16
)

// newFolds binds the twin of the launch that computes a one-row batch's
// logits (launch.logits) and draw_fold, for outFolded and
// outFoldedNucleus: the twin takes the launch's arguments and then the
// slots; draw_fold advances the draw steps at step. Without such a launch
// nothing folds.
func (e *exec) newFolds(ds *drawState, step uint64, field func(int) uint64) error {
	at := slices.IndexFunc(e.launches, func(l launch) bool { return l.logits })
	if at < 0 {
		return nil
	}
	pick, ok := e.be.funcs["draw_fold"]
	if !ok {
		return errors.New("cuda: a draw kernel is missing")
	}
	l := e.launches[at]
	twin := foldTwin(l.kernel)
	fn, ok := e.be.funcs[twin]
	if !ok {
		return fmt.Errorf("cuda: no kernel %s", twin)
	}
	slots, err := e.alloc(8*foldSlots*foldStride, "the folded draws")
	if err != nil {
		return err
	}
	ds.slots = slots
	copy(ds.foldArgs[:13], e.args[l.at:l.at+13])
	ds.foldArgs[13] = slots
	for j := range ds.foldArgs {
		ds.foldParams[j] = uintptr(unsafe.Pointer(&ds.foldArgs[j]))
	}
	l.fn, l.kernel, l.params = fn, twin, uintptr(unsafe.Pointer(&ds.foldParams[0]))
	ds.fold, ds.foldAt = l, at
	ds.nucFoldArgs = ds.nucArgs[1]
	ds.nucFoldArgs[12] = slots
	for j := range ds.nucFoldArgs {
		ds.nucFoldParams[j] = uintptr(unsafe.Pointer(&ds.nucFoldArgs[j]))
	}
	ds.pickArgs = [7]uint64{slots, e.meta, ds.ids, e.drawHost.drawnDev, field(fieldTokens), field(fieldPos), step}
	for j := range ds.pickArgs {
		ds.pickParams[j] = uintptr(unsafe.Pointer(&ds.pickArgs[j]))
	}
	ds.pick = launch{fn: pick, gridX: 1, gridY: gridOne, block: 32, params: uintptr(unsafe.Pointer(&ds.pickParams[0])),
		kernel: "draw_fold", which: metaSelected}
	return nil
}

// foldTwin is the name of the twin of one-row product kernel name that
// folds the draw into it (sample.cu's MATVEC1D).
func foldTwin(name string) string { return "matvec1d_" + strings.TrimPrefix(name, "matvec1_") }

// launchFor is launch i of a run whose output is out: its twin where the
// run folds its draw into the logits' product.
func (e *exec) launchFor(i, out int) *launch {
	if (out == outFolded || out == outFoldedNucleus) && i == e.draw.foldAt {
		return &e.draw.fold
	}
	return &e.launches[i]
}

var _ backend.LogprobSampler = (*exec)(nil)
