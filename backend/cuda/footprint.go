package cuda

import (
	"github.com/weftlm/weft/weights"
)

// The footprint functions estimate, before anything is allocated, the
// device memory a model part will take, so that placement can choose the
// layers that fit. They follow what Compile allocates: weights in their
// stored type (or f16 where the type has no kernel of its own), float32
// key/value caches, float32 activation buffers and the scratch areas.

// WeightBytes is the device memory one tensor takes once uploaded.
func WeightBytes(t *weights.Tensor) int64 {
	if len(t.Shape) < 2 {
		return t.Cols() * 4 // vectors arrive as float32
	}
	if _, native := weightTypes[t.Type]; native {
		return int64(t.Bytes)
	}
	return t.Rows() * t.Cols() * 2
}

// KVBytes is one slot's key and value cache for a layer holding ctx
// positions: float32 rows of KVDim each.
func KVBytes(c *weights.Config, ctx int) int64 {
	return 2 * 4 * int64(ctx) * int64(c.KVDim())
}

// WorkBytes bounds the activation buffers and scratch areas of one part
// running batches of up to maxRows rows, largest its largest matrix
// ([rows, cols], for the f16 copy cuBLAS multiplies).
func WorkBytes(c *weights.Config, maxRows int, largest *weights.Tensor) int64 {
	rows := int64(maxRows)
	widest := int64(max(c.Dim, c.QDim(), c.FFNDim))
	// Buffers: residual, normed, q, k, v, attention, gate, up and logits
	// (the model code's set, with room for a second normed copy).
	bufs := rows * int64(3*c.Dim+2*c.QDim()+2*c.KVDim()+2*c.FFNDim+c.VocabSize) * 4
	// int8 rows with their block scales, f16 rows for cuBLAS.
	scratch := rows*widest + rows*widest/32*8 + rows*widest*2
	if largest != nil {
		scratch += min(largest.Rows()*largest.Cols()*2, maxW16Bytes)
	}
	const modules = 64 << 20 // kernels, graphs and the meta arrays
	return bufs + scratch + modules
}
