package safetensors

// DType is a tensor element type as spelled in a safetensors header.
type DType string

// The element types this package reads and writes. Names and sizes follow
// the safetensors specification; F8_E4M3 is the "fn" variant (no infinities)
// that torch.float8_e4m3fn stores.
const (
	F64     DType = "F64"
	F32     DType = "F32"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I64     DType = "I64"
	I32     DType = "I32"
	I16     DType = "I16"
	I8      DType = "I8"
	U64     DType = "U64"
	U32     DType = "U32"
	U16     DType = "U16"
	U8      DType = "U8"
	BOOL    DType = "BOOL"
	F8_E4M3 DType = "F8_E4M3"
	F8_E5M2 DType = "F8_E5M2"
)

// dtypeSizes gives the bytes per element of every supported type.
var dtypeSizes = map[DType]int{
	F64: 8, F32: 4, F16: 2, BF16: 2,
	I64: 8, I32: 4, I16: 2, I8: 1,
	U64: 8, U32: 4, U16: 2, U8: 1,
	BOOL: 1, F8_E4M3: 1, F8_E5M2: 1,
}

// DTypes lists every supported type, widest first.
func DTypes() []DType {
	return []DType{F64, I64, U64, F32, I32, U32, F16, BF16, I16, U16, I8, U8, BOOL, F8_E4M3, F8_E5M2}
}

// Size returns the bytes per element, or 0 for an unsupported type.
func (d DType) Size() int { return dtypeSizes[d] }

// Valid reports whether d is a supported type.
func (d DType) Valid() bool { return d.Size() > 0 }
