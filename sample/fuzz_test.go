package sample

import (
	"encoding/binary"
	"math"
	"testing"
)

// FuzzSample feeds arbitrary parameters, logits and histories to New and
// Sample: they must return an error or a token that the chain can draw —
// inside the vocabulary, with a finite logit after the bias and penalties
// — and never panic; and where the Sampler reports the draw as one a
// device can make (Device), Draw.Sample must give the same token and leave
// the logits as they were.
func FuzzSample(f *testing.F) {
	f.Add(float32(0.8), 40, float32(0.9), float32(0.05), float32(1.1), float32(0.5), 16, int32(3), float32(-1),
		[]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 0, 192, 0, 0, 128, 255}, []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, temp float32, topK int, topP, minP, repeat, presence float32, window int,
		biasID int32, bias float32, logitBytes, histBytes []byte) {
		vocab := len(logitBytes) / 4
		if vocab == 0 || vocab > 4096 {
			return
		}
		logits := make([]float32, vocab)
		for i := range logits {
			logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(logitBytes[4*i:]))
		}
		history := make([]int32, len(histBytes))
		for i, b := range histBytes {
			history[i] = int32(b) - 8 // some out of the vocabulary
		}
		p := Params{Temperature: temp, TopK: topK, TopP: topP, MinP: minP, RepeatPenalty: repeat,
			PresencePenalty: presence, FrequencyPenalty: presence / 2, PenaltyWindow: window,
			LogitBias: map[int32]float32{biasID: bias}, Seed: 1}
		s, err := New(p, vocab)
		if err != nil {
			return
		}
		d, device := s.Device(history)
		tok, err := s.Sample(logits, history)
		if device {
			before := append([]float32(nil), logits...)
			dtok, derr := d.Sample(logits)
			if (derr == nil) != (err == nil) || err == nil && dtok != tok {
				t.Fatalf("Draw.Sample = %d, %v; Sampler.Sample %d, %v (%+v)", dtok, derr, tok, err, d)
			}
			for i := range logits {
				if math.Float32bits(logits[i]) != math.Float32bits(before[i]) {
					t.Fatalf("Draw.Sample changed logit %d: %v → %v", i, before[i], logits[i])
				}
			}
		}
		if err != nil {
			return
		}
		if tok < 0 || int(tok) >= vocab {
			t.Fatalf("token %d outside the vocabulary of %d", tok, vocab)
		}
		adjusted := logits
		if s.work != nil {
			adjusted = s.work
		}
		if v := adjusted[tok]; !(v > float32(math.Inf(-1))) {
			t.Fatalf("token %d drawn with logit %v", tok, v)
		}
	})
}
