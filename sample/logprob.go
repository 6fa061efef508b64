package sample

import "math"

// TokenLogProb is a token and its log-probability, for the logprobs and
// top_logprobs of an API response.
type TokenLogProb struct {
	ID      int32
	LogProb float32
}

// LogSumExp returns log Σ exp(logits[i]) (the log of the softmax's
// denominator), summed in float64 from the maximum so that nothing
// overflows; terms below e^-104 of the largest, and the float32 rounding
// of each term, change it by less than 1e-7 relative. NaN logits count as
// -Inf; the result is -Inf when every logit is. The log-probability of
// token i is logits[i] - LogSumExp(logits).
func LogSumExp(logits []float32) float32 {
	return float32(logSumExp(logits))
}

func logSumExp(logits []float32) float64 {
	id := argmax(logits)
	if id < 0 {
		return math.Inf(-1)
	}
	return logSumExpFrom(logits, logits[id])
}

func logSumExpFrom(logits []float32, mx float32) float64 {
	if math.IsInf(float64(mx), 1) {
		return math.Inf(1)
	}
	sum := 0.0
	for _, v := range logits {
		sum += float64(prob(v, mx, 1))
	}
	return float64(mx) + math.Log(sum)
}

// LogSoftmax writes log softmax(logits) to dst, grown to len(logits) if its
// capacity is short, and returns it. NaN logits count as -Inf.
func LogSoftmax(logits []float32, dst []float32) []float32 {
	if cap(dst) < len(logits) {
		dst = make([]float32, len(logits))
	}
	dst = dst[:len(logits)]
	lse := logSumExp(logits)
	negInf := float32(math.Inf(-1))
	for i, v := range logits {
		if v > negInf {
			dst[i] = float32(float64(v) - lse)
		} else {
			dst[i] = negInf
		}
	}
	return dst
}

// TopLogProbs returns in dst (reused when its capacity allows) the n most
// probable tokens of softmax(logits) with their log-probabilities, most
// probable first, ties to the lowest id. NaN and -Inf logits are never
// listed, so fewer than n come back when fewer are finite.
func TopLogProbs(logits []float32, n int, dst []TokenLogProb) []TokenLogProb {
	dst = topLogits(logits, n, dst)
	if len(dst) == 0 {
		return dst
	}
	return toLogProbs(dst, logSumExpFrom(logits, dst[0].LogProb))
}

// TokenLogProbs returns token id's log-probability under softmax(logits)
// and, in dst, the n most probable tokens as TopLogProbs gives them, from
// one log-sum-exp: a drawn token listed among them has the same value in
// both. As in LogSoftmax, a NaN or -Inf logit's log-probability is -Inf.
func TokenLogProbs(logits []float32, id int32, n int, dst []TokenLogProb) (float32, []TokenLogProb) {
	lse := logSumExp(logits)
	lp := float32(math.Inf(-1))
	if v := logits[id]; v > lp {
		lp = float32(float64(v) - lse)
	}
	return lp, toLogProbs(topLogits(logits, n, dst), lse)
}

// toLogProbs turns the raw logits of top into log-probabilities, lse being
// their row's log-sum-exp.
func toLogProbs(top []TokenLogProb, lse float64) []TokenLogProb {
	for i := range top {
		top[i].LogProb = float32(float64(top[i].LogProb) - lse)
	}
	return top
}

// topLogits returns in dst the n largest finite logits with their ids,
// largest first, ties to the lowest id. The n best are kept sorted while
// scanning: a logit that does not beat the n-th costs one comparison,
// which is almost every logit when n is the handful an API asks for.
func topLogits(logits []float32, n int, dst []TokenLogProb) []TokenLogProb {
	dst = dst[:0]
	if n <= 0 {
		return dst
	}
	negInf := float32(math.Inf(-1))
	for i, v := range logits {
		if !(v > negInf) || (len(dst) == n && !(v > dst[n-1].LogProb)) {
			continue
		}
		j := len(dst)
		if j < n {
			dst = append(dst, TokenLogProb{})
		} else {
			j--
		}
		for ; j > 0 && dst[j-1].LogProb < v; j-- {
			dst[j] = dst[j-1]
		}
		dst[j] = TokenLogProb{int32(i), v}
	}
	return dst
}
