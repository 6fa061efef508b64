package engine

import (
	"fmt"
	"math"

	"github.com/weftlm/weft/weights"
)

// ropeInvFreq returns the rotary inverse frequencies of one table:
// invFreq[i] = theta^(-2i/ropeDim) for i < ropeDim/2, then stretched by the
// config's scaling and divided by per-dimension factors when the file gives
// them (GGUF llama 3 stores its scaling as rope_freqs.weight).
func ropeInvFreq(ropeDim int, theta float64, s weights.RopeScaling, factors []float32) ([]float64, error) {
	half := ropeDim / 2
	f := make([]float64, half)
	for i := range f {
		f[i] = 1 / math.Pow(theta, float64(2*i)/float64(ropeDim))
	}
	switch s.Type {
	case "", "none":
	case "linear":
		for i := range f {
			f[i] /= s.Factor
		}
	case "llama3":
		// Long wavelengths are slowed by the factor, short ones kept, and
		// the band between blended smoothly.
		lowWavelen := float64(s.OriginalCtx) / s.LowFreqFactor
		highWavelen := float64(s.OriginalCtx) / s.HighFreqFactor
		for i, inv := range f {
			wavelen := 2 * math.Pi / inv
			switch {
			case wavelen < highWavelen:
			case wavelen > lowWavelen:
				f[i] = inv / s.Factor
			default:
				smooth := (float64(s.OriginalCtx)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				f[i] = (1-smooth)*inv/s.Factor + smooth*inv
			}
		}
	default:
		return nil, fmt.Errorf("rope scaling %q is not supported", s.Type)
	}
	if factors != nil {
		if len(factors) != half {
			return nil, fmt.Errorf("rope_freqs has %d factors, want %d", len(factors), half)
		}
		for i := range f {
			if !(factors[i] > 0) {
				return nil, fmt.Errorf("rope_freqs[%d] = %g is not positive", i, factors[i])
			}
			f[i] /= float64(factors[i])
		}
	}
	return f, nil
}
