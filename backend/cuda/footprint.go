package cuda

import (
	"github.com/weftlm/weft/backend"
	"github.com/weftlm/weft/weights"
)

// The footprint functions estimate, before anything is allocated, the
// device memory a model part will take, so that placement can choose the
// layers that fit. They follow what Compile allocates: weights in their
// stored type (or Q8_0 or f16 where the type has no kernel of its own),
// float32 or f16 key/value caches, float32 activation buffers and the scratch
// areas.

// WeightBytes is the device memory one tensor takes once uploaded (by a
// backend made with the environment's WEFT_CUDA_EXACT).
func WeightBytes(t *weights.Tensor) int64 {
	if len(t.Shape) < 2 {
		return t.Cols() * 4 // vectors arrive as float32
	}
	if k := kLayouts[t.Type]; k != nil && t.Cols()%256 == 0 {
		return t.Rows() * t.Cols() / 256 * int64(k.deviceBlock()) // Q2_K's levels grow to nibbles
	}
	if _, native := weightTypes[t.Type]; native {
		return int64(t.Bytes)
	}
	if q8Exact[t.Type] && t.Cols()%32 == 0 && t.MLX == nil {
		return t.Rows() * t.Cols() / 32 * q8Block
	}
	if q8Affine[t.Type] && t.Cols()%32 == 0 && t.MLX == nil {
		return t.Rows() * t.Cols() / 32 * q8aBlock // the device layout: 32 levels and 4 bytes of d, m
	}
	if t.Type == "Q3_K" && t.Cols()%256 == 0 && t.MLX == nil {
		return t.Rows() * t.Cols() / 256 * int64(kLayouts["Q6_K"].block) // as Q6_K
	}
	if exactOn() && !backend.Int8Activations(t.Type) {
		return t.Rows() * t.Cols() * 4 // F32 under the exact contract (describeConverted)
	}
	return t.Rows() * t.Cols() * 2
}

// KVBytes is one slot's key and value cache for a layer holding ctx
// positions: rows of KVDim float32s, or IEEE halves with f16.
func KVBytes(c *weights.Config, ctx int, f16 bool) int64 {
	size := int64(4)
	if f16 {
		size = 2
	}
	return 2 * size * int64(ctx) * int64(c.KVDim())
}

// ModuleBytes is what a device part takes beside its program's own
// allocations: the kernel module, the captured graphs and the batch
// staging, with room to spare.
const ModuleBytes = 64 << 20

// WorkBytes bounds the activation buffers and scratch areas of one part
// running batches of up to maxRows rows, largest its largest matrix
// (for the f16 copy cuBLAS multiplies and the upload staging), plus
// ModuleBytes.
func WorkBytes(c *weights.Config, maxRows int, largest *weights.Tensor) int64 {
	rows := int64(maxRows)
	widest := int64(max(c.Dim, c.QDim(), c.FFNDim))
	// Buffers, as engine/build.go makes them: six of Dim (residual,
	// normed, attention output, FFN output, selected rows and their norm),
	// q and attention, k and v, gate and up, and the logits.
	bufs := rows * int64(6*c.Dim+2*c.QDim()+2*c.KVDim()+2*c.FFNDim+c.VocabSize) * 4
	// Two sets of int8 rows with their scales (Q8_0-style per 32, and
	// Q8_K per 256 or a fused GLU's output), f16 rows for cuBLAS.
	scratch := 2*(rows*widest+rows*widest/32*8) + rows*widest*2
	if largest != nil {
		// The f16 copy for cuBLAS, and the staging area Q8_0 and Q4_0
		// weights are repacked through on upload.
		scratch += min(largest.Rows()*largest.Cols()*2, maxW16Bytes) + WeightBytes(largest)
	}
	// Split decode attention's partial results (at most attSplitMax
	// splits) and counters.
	rows8 := min(rows, smallRows)
	scratch += 4 * rows8 * (int64(c.NHeads)*attSplitMax*int64(c.HeadDim+2) + int64(c.NKVHeads))
	// The device draws (sample.go's drawState): a partial and up to
	// MaxTopK candidates a vocabulary chunk and row, ids and counts, a
	// nucleus row's cut and masses by digit, a penalty window and a logit
	// bias; the folded draws' slots.
	chunks := int64((c.VocabSize + drawChunk - 1) / drawChunk)
	scratch += rows*(chunks*8*(1+backend.MaxTopK)+(chunks+drawGroup-1)/drawGroup*4+8+nucleusBytes+8*nucBuckets+
		4*backend.MaxWindow+8*backend.MaxBias) + 8*foldSlots*foldStride
	// The batch (meta) and the rope tables (local and global), and the
	// draws' parameters after the batch.
	small := 4*(metaArrays+4*rows) + 2*4*int64(c.HeadDim) + drawParamBytes*rows
	return bufs + scratch + small + ModuleBytes
}

// ProgramBytes is the device memory Compile allocates for p — buffers,
// weights as stored, rope tables, caches, scratch areas (with cuBLAS, the
// larger set) and the batch — beside what the driver and the kernel module
// take. It needs no GPU.
func ProgramBytes(p *backend.Program) (int64, error) {
	pl, err := plan(p, planOptions{gemm: true, sms: 132, kA32: !kActQ8K})
	if err != nil {
		return 0, err
	}
	return int64(deviceBytes(p, pl)), nil
}
