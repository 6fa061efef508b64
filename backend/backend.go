// Package backend defines the seam between the engine and the hardware: a
// Program — the per-token plan, a flat list of operations over numbered
// activation buffers, built once per model — and the Backend interface that
// turns a Program into something it can replay for every batch of tokens
// with only the token ids, positions and sequence slots changing.
//
// The model code (package engine) emits a Program from an architecture
// descriptor and never asks which device runs it; a backend never asks
// which architecture it runs.
package backend

import (
	"fmt"
	"math"

	"github.com/weftlm/weft/weights"
)

// BufID names an activation buffer of a Program: a [MaxRows, Cols] matrix
// of float32, one row per token of the batch.
type BufID int

// WeightID names a weight of a Program.
type WeightID int

// NoWeight marks an absent optional weight (a bias, say).
const NoWeight WeightID = -1

// OpKind is an operation.
type OpKind int

// Operations. Unless noted, an op works on every row of the batch (Rows)
// or, with OnSelected, on the rows the batch asks logits for.
const (
	// OpEmbed: Out[r] = dequant(Embedding[token[r]]) * Scale.
	OpEmbed OpKind = iota
	// OpRMSNorm: Out[r] = A[r] / rms(A[r]) * W, over groups of Group
	// columns (Group = Cols for a whole-row norm, HeadDim for QK-norm).
	OpRMSNorm
	// OpMatMul: Out[r] = W · A[r] (+ Bias). W is [Out cols, A cols].
	OpMatMul
	// OpRope rotates A in place: NHeads heads of HeadDim, the first RopeDim
	// dims of each, pairing by Layout, at each row's position, with the
	// frequencies of rope table Table.
	OpRope
	// OpStoreKV writes K=A and V=B rows into layer Layer's cache at each
	// row's slot and position.
	OpStoreKV
	// OpAttention: Out[r] = softmax(Scale * Q[r]·K + mask) · V over layer
	// Layer's cache for the row's slot, positions [pos-Window+1, pos]
	// (Window 0: [0, pos]); Q = A with NHeads heads, NKVHeads kv heads.
	OpAttention
	// OpAdd: Out = A + B.
	OpAdd
	// OpGLU: Out = act(A) * B with act = Act.
	OpGLU
	// OpGather: Out[i] = A[selected[i]], switching to the selected rows.
	OpGather
	// OpSoftcap: Out = Cap * tanh(A / Cap).
	OpSoftcap
)

var opNames = [...]string{"embed", "rmsnorm", "matmul", "rope", "store_kv", "attention", "add", "glu", "gather", "softcap"}

func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", int(k))
}

// Activation functions for OpGLU.
const (
	ActSiLU     = 0 // x * sigmoid(x)
	ActGELUTanh = 1 // 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))
)

// RoPE pairings.
const (
	RopeInterleaved = 0 // (x0,x1), (x2,x3), …
	RopeNeoX        = 1 // (x_i, x_{i+d/2})
)

// Op is one entry of the plan. Fields unused by its Kind are zero.
type Op struct {
	Kind       OpKind
	Layer      int // transformer layer, or -1 for embedding/output ops
	Out, A, B  BufID
	W, Bias    WeightID
	OnSelected bool // operate on the selected (logit) rows
	// Head marks the ops that turn the final hidden state into logits;
	// a batch asking for hidden states skips them.
	Head bool

	Eps     float32 // RMSNorm
	Group   int     // RMSNorm group width
	Scale   float32 // Embed multiplier; Attention score scale
	Cap     float32 // Softcap; Attention score soft-cap (0 = none)
	Act     int     // GLU activation
	Table   int     // RoPE table index
	Layout  int     // RoPE pairing
	NHeads  int
	NKV     int
	HeadDim int
	RopeDim int
	Window  int // attention sliding window (0 = none)
}

// Weight is a tensor the Program reads. The backend uploads Data in its
// stored type (possibly repacking it); norm vectors arrive already as
// float32 with any offset applied.
type Weight struct {
	Name   string // canonical name, for errors
	Tensor *weights.Tensor
	Data   weights.Data
	// F32 holds vectors the engine prepared (norm weights with offsets,
	// biases); when set it replaces Data.
	F32 []float32
}

// RopeTable is a set of rotary inverse frequencies: angle(pos, i) =
// pos * InvFreq[i] for i < RopeDim/2.
type RopeTable struct {
	InvFreq []float64
}

// Cache describes layer Layer's key/value cache: Capacity positions of
// KVDim floats each for K and for V, per sequence slot. A sliding-window
// layer needs only Window + MaxRows positions and is used as a ring.
// With F16 the keys and values are stored as IEEE half floats (rounded to
// nearest even as they are stored), half the memory of float32.
type Cache struct {
	Layer    int
	KVDim    int
	Capacity int
	F16      bool
}

// Program is the whole per-token plan of a model.
type Program struct {
	MaxRows int   // the most rows (tokens) one batch may carry
	Slots   int   // independent sequences, each with its own caches
	Context int   // positions run from 0 to Context-1
	Bufs    []int // column count of each activation buffer
	Weights []Weight
	Ropes   []RopeTable
	Caches  []Cache // one per layer, indexed by layer
	Ops     []Op
	Logits  BufID // where the selected rows' logits end up
	Vocab   int
	// Hidden holds the selected rows' final normalised hidden states
	// (Dim columns) once the non-head ops have run.
	Hidden BufID
	Dim    int
	// Residual is the buffer carrying the hidden state from layer to
	// layer: the only activation a layer-split placement hands over.
	Residual BufID
}

// Batch is the per-step input: Rows tokens, each with its position and
// sequence slot, and the rows whose logits are wanted.
type Batch struct {
	Tokens   []int32
	Pos      []int32
	Slots    []int32
	Selected []int32 // row indices, ascending; their logits are produced
	// HiddenOnly asks for the selected rows' final hidden states (Dim
	// floats each) instead of logits: the Head ops are skipped.
	HiddenOnly bool
}

// Validate checks a batch against the program's limits.
func (p *Program) Validate(b *Batch) error {
	n := len(b.Tokens)
	if n == 0 || n > p.MaxRows {
		return fmt.Errorf("batch of %d rows, want 1..%d", n, p.MaxRows)
	}
	if len(b.Pos) != n || len(b.Slots) != n {
		return fmt.Errorf("batch has %d tokens, %d positions, %d slots", n, len(b.Pos), len(b.Slots))
	}
	if len(b.Selected) == 0 || len(b.Selected) > n {
		return fmt.Errorf("batch selects %d rows of %d", len(b.Selected), n)
	}
	for i, r := range b.Selected {
		if r < 0 || int(r) >= n || (i > 0 && r <= b.Selected[i-1]) {
			return fmt.Errorf("selected rows %v not ascending within [0,%d)", b.Selected, n)
		}
	}
	for i, s := range b.Slots {
		if s < 0 || int(s) >= p.Slots {
			return fmt.Errorf("row %d: slot %d outside [0,%d)", i, s, p.Slots)
		}
		if b.Pos[i] < 0 || int(b.Pos[i]) >= p.Context {
			return fmt.Errorf("row %d: position %d outside the context [0,%d)", i, b.Pos[i], p.Context)
		}
	}
	for i, t := range b.Tokens {
		if t < 0 || int(t) >= p.Vocab {
			return fmt.Errorf("row %d: token %d outside the vocabulary [0,%d)", i, t, p.Vocab)
		}
	}
	return nil
}

// Backend compiles Programs for one kind of device.
type Backend interface {
	// Name identifies the backend ("cpu", "cuda:0").
	Name() string
	// Supports reports whether the backend can multiply by a weight of
	// this type (a tensor's Type string as package weights spells it).
	Supports(weightType string) bool
	// Compile uploads the program's weights, allocates its buffers and
	// caches, and returns an executable plan.
	Compile(p *Program) (Exec, error)
	// Close releases the backend.
	Close() error
}

// Exec is a compiled Program.
type Exec interface {
	// Run executes the plan for one batch and copies the selected rows'
	// logits into out ([len(Selected), Vocab], row-major) — or, for a
	// HiddenOnly batch, their hidden states ([len(Selected), Dim]). Run
	// never allocates.
	Run(b *Batch, out []float32) error
	// Close frees the plan's buffers, caches and weights.
	Close() error
}

// KeyReader is implemented by executables that can read back cached keys
// (for attention inspection): n positions from pos of layer's cache in
// slot, as they were stored (after RoPE), into dst ([n, KVDim]).
type KeyReader interface {
	ReadKeys(layer, slot, pos, n int, dst []float32) error
}

// RowWriter is implemented by executables whose buffers can be filled from
// the host before a run: rows of buf from src ([rows, cols] row-major).
// A layer-split placement uses it to hand the residual stream over.
type RowWriter interface {
	WriteRows(buf BufID, src []float32) error
}

// Viewer is implemented by executables that can hand out a run's output
// rows where they landed, sparing the copy into a caller's buffer:
// RunView is Run of a batch of one selected row, returning that row in
// host memory the executable owns, valid until its next run. It never
// allocates.
type Viewer interface {
	RunView(b *Batch) ([]float32, error)
}

// Sampling is how a device chooses one row's next token: the Gumbel-max
// draw sample.SampleGumbel(logits, Temperature, Seed, Step) — the argmax
// when Temperature is 0 — or, when TopK is set and Temperature is not 0,
// sample.SampleTopK(logits, Temperature, TopK, TopP, MinP, Seed, Step),
// or, with no TopK but a top-p or a min-p (Nucleus) and a Temperature,
// sample.SampleNucleus(logits, Temperature, TopP, MinP, Seed, Step) (a
// TopP of 0 read as 1).
//
// With a logit bias (BiasValues[i] added to the logit of BiasIDs[i]) and
// penalties (Window > 0 and a RepeatPenalty other than 0 or 1, or a
// PresencePenalty or FrequencyPenalty, on the logits of the tokens of
// Recent, the last at most Window tokens of the row's history, oldest
// first), the logits are changed first, in that order, as
// sample.Draw.Sample does; a Pipeliner's IssueNext appends each row's draw
// to its window.
type Sampling struct {
	Temperature float32
	TopK        int     // 0, or 1 to MaxTopK
	TopP, MinP  float32 // top-p in [0, 1] (0 and 1 are off; with a TopK, in (0, 1]), min-p in [0, 1] (0 is off)
	// RepeatPenalty is positive or 0 (off, as 1); the others finite.
	RepeatPenalty, PresencePenalty, FrequencyPenalty float32
	Window                                           int       // 0 to MaxWindow
	Recent                                           []int32   // at most Window tokens
	BiasIDs                                          []int32   // ascending, at most MaxBias
	BiasValues                                       []float32 // finite or -Inf
	Seed, Step                                       uint64
	// Logprobs asks a LogprobSampler for the draw's log-probability and
	// the TopLogprobs (0 to MaxTopLogprobs) most probable tokens, under
	// the raw logits (before the bias and penalties).
	Logprobs    bool
	TopLogprobs int
}

// MaxTopLogprobs is the largest Sampling.TopLogprobs (the OpenAI API's
// top_logprobs limit).
const MaxTopLogprobs = 20

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// MaxTopK is the largest Sampling.TopK (sample.MaxDrawTopK).
const MaxTopK = 64

// MaxWindow is the largest Sampling.Window (sample.MaxDrawWindow), MaxBias
// the most Sampling.BiasIDs (sample.MaxDrawBias).
const (
	MaxWindow = 256
	MaxBias   = 512
)

// Adjusts reports whether s changes logits before its draw: a bias or
// penalties.
func (s Sampling) Adjusts() bool { return len(s.BiasIDs) > 0 || s.Penalizes() }

// Penalizes reports whether s applies penalties.
func (s Sampling) Penalizes() bool {
	return s.Window > 0 && (s.RepeatPenalty != 0 && s.RepeatPenalty != 1 || s.PresencePenalty != 0 || s.FrequencyPenalty != 0)
}

// Nucleus reports whether s is a sample.SampleNucleus draw.
func (s Sampling) Nucleus() bool {
	return s.Temperature > 0 && s.TopK == 0 && (s.TopP > 0 && s.TopP < 1 || s.MinP > 0)
}

// Check reports a Sampling no draw can follow.
func (s Sampling) Check() error {
	switch {
	case !(s.Temperature >= 0) || s.Temperature > math.MaxFloat32:
		return fmt.Errorf("temperature %v, want 0 (greedy) or a positive finite value", s.Temperature)
	case s.TopK < 0 || s.TopK > MaxTopK:
		return fmt.Errorf("top-k %d outside [0, %d]", s.TopK, MaxTopK)
	case s.TopK > 0 && !(s.TopP > 0 && s.TopP <= 1):
		return fmt.Errorf("top-p %v outside (0, 1]", s.TopP)
	case !(s.TopP >= 0 && s.TopP <= 1):
		return fmt.Errorf("top-p %v outside [0, 1]", s.TopP)
	case !(s.MinP >= 0 && s.MinP <= 1):
		return fmt.Errorf("min-p %v outside [0, 1]", s.MinP)
	case !(s.RepeatPenalty >= 0) || s.RepeatPenalty > math.MaxFloat32:
		return fmt.Errorf("repeat penalty %v, want 0 (off) or a positive finite value", s.RepeatPenalty)
	case math.IsNaN(float64(s.PresencePenalty)) || math.IsInf(float64(s.PresencePenalty), 0) ||
		math.IsNaN(float64(s.FrequencyPenalty)) || math.IsInf(float64(s.FrequencyPenalty), 0):
		return fmt.Errorf("presence penalty %v, frequency penalty %v: want finite values", s.PresencePenalty, s.FrequencyPenalty)
	case s.Window < 0 || s.Window > MaxWindow:
		return fmt.Errorf("penalty window %d outside [0, %d]", s.Window, MaxWindow)
	case len(s.Recent) > s.Window:
		return fmt.Errorf("a penalty window of %d holding %d tokens", s.Window, len(s.Recent))
	case len(s.BiasIDs) != len(s.BiasValues) || len(s.BiasIDs) > MaxBias:
		return fmt.Errorf("a logit bias of %d ids and %d values, at most %d", len(s.BiasIDs), len(s.BiasValues), MaxBias)
	case s.TopLogprobs < 0 || s.TopLogprobs > MaxTopLogprobs:
		return fmt.Errorf("top logprobs %d outside [0, %d]", s.TopLogprobs, MaxTopLogprobs)
	case s.TopLogprobs > 0 && !s.Logprobs:
		return fmt.Errorf("top logprobs %d without logprobs", s.TopLogprobs)
	}
	for i, id := range s.BiasIDs {
		if id < 0 || i > 0 && id <= s.BiasIDs[i-1] {
			return fmt.Errorf("logit bias token %d negative or out of order", id)
		}
		if b := s.BiasValues[i]; math.IsNaN(float64(b)) || math.IsInf(float64(b), 1) {
			return fmt.Errorf("logit bias %v for token %d, want a finite value or -Inf", b, id)
		}
	}
	return nil
}

// Sampler is implemented by executables that can choose the selected
// rows' next tokens where the logits are, so that a decode step hands the
// host token ids instead of [rows, Vocab] logits: out[i] is the draw for
// the row Selected[i] under s[i]. It never allocates.
type Sampler interface {
	RunSampled(b *Batch, s []Sampling, out []int32) error
}

// LogprobSampler is implemented by Samplers that report, with the draw of
// each row whose Sampling sets Logprobs, the log-probabilities of the
// row's raw logits (before its bias and penalties) as
// sample.TokenLogProbs gives them: the drawn token's and those of the
// row's TopLogprobs most probable tokens, most probable first, ties to
// the lower id, NaN and -Inf logits never listed.
type LogprobSampler interface {
	Sampler
	// Logprobs reports row i's of the draws handed out last (by
	// RunSampled, or by WaitSampled for a Pipeliner): the drawn token's
	// log-probability, and the most probable tokens written into top
	// (which has room for the row's TopLogprobs), returning how many.
	// It never allocates.
	Logprobs(i int, top []TokenLogprob) (float32, int)
}

// Pipeliner is implemented by Samplers that can queue decode steps ahead
// of the host: the next step, fed the draws of the one before it, is
// queued before those draws reach the host, so that the device goes from
// one step to the next without waiting for the host in between. At most
// MaxPipelined steps are issued and not waited for; any other run of the
// executable fails while one is.
type Pipeliner interface {
	Sampler
	// IssueSampled queues RunSampled(b, s, ·) for a decode batch (one row
	// a sequence, row i selected as the i-th) and returns without
	// waiting for it.
	IssueSampled(b *Batch, s []Sampling) error
	// IssueNext queues the step after the one issued last (by
	// IssueSampled or IssueNext, with no other run since): each row's
	// token is its draw of that step, its position one further, and its
	// draw's Step one further.
	IssueNext() error
	// WaitSampled waits for the oldest step issued and not yet waited for
	// and writes its draws into out ([rows]).
	WaitSampled(out []int32) error
}

// MaxPipelined is the most steps a Pipeliner holds issued and not waited
// for.
const MaxPipelined = 2
