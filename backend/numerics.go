package backend

// int8Types are the weight types (GGUF spellings) whose products take
// their activations rounded to int8 levels: per 32 elements for the
// 32-element block types, per 256 (Q8_K, with sums per 16) for the
// k-quants and IQ4_XS, as ggml does. Products by every other type (the
// float types, the other codebook and ternary types, MLX affine) take
// float32 activations.
var int8Types = map[string]bool{
	"Q4_0": true, "Q4_1": true, "Q5_0": true, "Q5_1": true, "Q8_0": true, "IQ4_NL": true,
	"Q2_K": true, "Q3_K": true, "Q4_K": true, "Q5_K": true, "Q6_K": true, "IQ4_XS": true,
}

// Int8Activations reports whether products by weights of type typ round
// their activations to int8 levels first. It is part of the numeric
// contract every backend keeps, so that two backends multiply the same
// integers; a backend that cannot do so for a type (say, one that
// converts it to f16) differs from the others by what the rounding
// costs.
func Int8Activations(typ string) bool { return int8Types[typ] }
