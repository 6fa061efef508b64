package weft

import (
	"context"
	"fmt"
	"time"

	"github.com/weftlm/weft/engine"
	"github.com/weftlm/weft/sample"
)

// Classification is the outcome of one prompt of Classify.
type Classification struct {
	// Logits are the last position's logits ([vocab]).
	Logits []float32
	// Token is the next token: sampled with the options' sampling
	// settings (greedy unless a temperature is set).
	Token int32
	Text  string
}

// encode tokenizes a prompt for a generation request.
func (m *Model) encode(prompt string, g GenerateOptions) ([]int32, error) {
	if m.tok == nil {
		return nil, ErrNoTokenizer
	}
	ids := m.tok.Encode(prompt, g.addSpecial, g.parseSpecial)
	if len(ids) == 0 {
		return nil, fmt.Errorf("weft: empty prompt and the model adds no BOS token")
	}
	if len(ids) > m.eng.Context() {
		return nil, &PromptTooLongError{Tokens: len(ids), Context: m.eng.Context()}
	}
	return ids, nil
}

// encodeAll tokenizes every prompt of a batch request.
func (m *Model) encodeAll(prompts []string, g GenerateOptions) ([][]int32, error) {
	all := make([][]int32, len(prompts))
	for i, p := range prompts {
		ids, err := m.encode(p, g)
		if err != nil {
			return nil, fmt.Errorf("weft: prompt %d: %w", i, err)
		}
		all[i] = ids
	}
	return all, nil
}

// acquireMany takes up to n slots (at least one), waiting for the first.
func (m *Model) acquireMany(ctx context.Context, n int) ([]*engine.Sequence, func(), error) {
	seq, release, err := m.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	seqs, releases := []*engine.Sequence{seq}, []func(){release}
	for len(seqs) < n {
		select {
		case <-m.slots:
			m.slots <- struct{}{}
		default:
			n = len(seqs) // no slot free now: go with what we have
			continue
		}
		s, r, err := m.acquire(ctx)
		if err != nil {
			break
		}
		seqs, releases = append(seqs, s), append(releases, r)
	}
	return seqs, func() {
		for _, r := range releases {
			r()
		}
	}, nil
}

// Classify runs each prompt through the model without generating (a
// prefill-only batch: several prompts share each forward replay, up to the
// model's parallelism at a time) and returns every prompt's last-position
// logits and next token.
func (m *Model) Classify(ctx context.Context, prompts []string, opts ...GenerateOption) ([]Classification, error) {
	g := m.genOptions(opts)
	all, err := m.encodeAll(prompts, g)
	if err != nil {
		return nil, err
	}
	out := make([]Classification, len(prompts))
	v := m.eng.Vocab()
	for done := 0; done < len(prompts); {
		seqs, release, err := m.acquireMany(ctx, len(prompts)-done)
		if err != nil {
			return nil, err
		}
		n := len(seqs)
		logits := make([]float32, n*v)
		start := time.Now()
		err = m.eng.Prefill(seqs, all[done:done+n], logits)
		release()
		if err != nil {
			return nil, err
		}
		tokens := 0
		for i := range n {
			tokens += len(all[done+i])
			row := logits[i*v : (i+1)*v]
			s, err := sample.New(g.Sampling, v)
			if err != nil {
				return nil, err
			}
			id, err := s.Sample(row, all[done+i])
			if err != nil {
				return nil, err
			}
			out[done+i] = Classification{Logits: row, Token: id}
			if m.tok != nil {
				out[done+i].Text = m.tok.Piece(id)
			}
		}
		m.recordPrefill(tokens, time.Since(start))
		done += n
	}
	return out, nil
}

// Completion is the outcome of one prompt of BatchGenerate.
type Completion struct {
	Text         string
	Tokens       []int32
	FinishReason string
	Notices      []string
}

// BatchGenerate completes every prompt, decoding up to the model's
// parallelism of them together: their prompts are prefilled in shared
// replays and each decode step advances all live sequences at once.
// Each prompt samples with its own generator seeded from the options, so a
// prompt gives the same completion alone and in a batch.
func (m *Model) BatchGenerate(ctx context.Context, prompts []string, opts ...GenerateOption) ([]Completion, error) {
	g := m.genOptions(opts)
	all, err := m.encodeAll(prompts, g)
	if err != nil {
		return nil, err
	}
	out := make([]Completion, len(prompts))
	for done := 0; done < len(prompts); {
		seqs, release, err := m.acquireMany(ctx, len(prompts)-done)
		if err != nil {
			return nil, err
		}
		err = m.batchWave(ctx, seqs, all[done:done+len(seqs)], g, out[done:done+len(seqs)])
		release()
		if err != nil {
			return nil, err
		}
		done += len(seqs)
	}
	return out, nil
}

// batchWave generates for one group of sequences to the end.
func (m *Model) batchWave(ctx context.Context, seqs []*engine.Sequence, prompts [][]int32, g GenerateOptions, out []Completion) error {
	v := m.eng.Vocab()
	streams := make([]*stream, len(seqs))
	for i, p := range prompts {
		st, err := m.newStream(p, g)
		if err != nil {
			return err
		}
		streams[i] = st
	}
	logits := make([]float32, len(seqs)*v)
	start := time.Now()
	if err := m.eng.Prefill(seqs, prompts, logits); err != nil {
		return err
	}
	tokens := 0
	for _, p := range prompts {
		tokens += len(p)
	}
	m.recordPrefill(tokens, time.Since(start))
	live := make([]int, len(seqs)) // indices of unfinished sequences
	for i := range live {
		live[i] = i
	}
	rows := make([][]float32, len(seqs))
	for i := range seqs {
		rows[i] = append([]float32(nil), logits[i*v:(i+1)*v]...)
	}
	var stepSeqs []*engine.Sequence
	var stepToks []int32
	var stepStreams []*stream
	var stepRows [][]float32
	var buf stepBuffers
	for len(live) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		stepSeqs, stepToks, stepStreams, stepRows = stepSeqs[:0], stepToks[:0], stepStreams[:0], stepRows[:0]
		next := live[:0]
		for _, i := range live {
			tok, err := streams[i].next(rows[i])
			if err != nil {
				return err
			}
			if !tok.Done && seqs[i].Pos() >= m.eng.Context() {
				tok = streams[i].last(tok, "length")
			}
			c := &out[i]
			c.Text += tok.Text
			if tok.Sampled && tok.Done {
				c.Tokens = append(c.Tokens, tok.ID)
			}
			if tok.Done {
				c.FinishReason, c.Notices = tok.FinishReason, tok.Notices
				m.recordGeneration(streams[i].generated, start, start)
				continue
			}
			c.Tokens = append(c.Tokens, tok.ID)
			next = append(next, i)
			stepSeqs, stepToks = append(stepSeqs, seqs[i]), append(stepToks, tok.ID)
			stepStreams, stepRows = append(stepStreams, streams[i]), append(stepRows, rows[i])
		}
		live = next
		if len(live) == 0 {
			break
		}
		if err := m.decodeStep(stepSeqs, stepToks, stepStreams, stepRows, &buf); err != nil {
			return err
		}
	}
	return nil
}
