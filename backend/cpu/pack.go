package cpu

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// tileRows is how many weight rows a tile interleaves: one 32-byte vector
// holds four consecutive elements of each of 8 rows (or one float of each),
// so a dot product accumulates in 8 lanes, one per output row, and needs
// no horizontal sum.
const tileRows = 8

// packed is a weight matrix [rows, cols] repacked into tiles of tileRows
// rows. A tile is nb blocks; block b of a tile is, by family:
//
//	legacy: d[8] fp16 | m[8] fp16 (affine types) | levels of 32 elements
//	k:      d[8] fp16 | dmin[8] fp16 (affine) | sc[nsub][8] int8 |
//	        m[nsub][8] uint8 (affine) | levels of 8 groups of 32 elements
//	float:  one element of each of the 8 rows in the stored float type
//
// Levels of 32 elements of the 8 rows take 256 bytes (u8: vector t, lane
// r holds elements 4t..4t+3 of row r) or 128 (u4: vector p, lane r, byte i
// holds element 4p+i in its low nibble and 16+4p+i in its high nibble),
// followed for 5- and 6-bit levels by their top bits: one vector (byte
// (r, i) bit t is bit 4 of element 4t+i) or two (vector j, bits 2k..2k+1
// are bits 4-5 of element 4(4j+k)+i). Rows past the end of the matrix are
// zero.
type packed struct {
	f          *format
	rows, cols int
	tiles      int
	nb         int // blocks per row
	nsub       int // sub-blocks per k-quant super-block
	blockBytes int // bytes of one block of a tile
	tileBytes  int
	data       []byte
	// signed8 marks offset-128 u8 levels stored as signed bytes (level
	// XOR 0x80, offset 0), for kernels that multiply signed by signed.
	signed8 bool
	variant string // names the kernels that read this layout (variantOf)
}

// groupBytes is the size of the levels of 32 elements of a tile.
func (f *format) groupBytes() int {
	if f.u4 {
		return (16 + 4*f.hbits) * tileRows
	}
	return 32 * tileRows
}

// offsets of the parts of a tile block
func (p *packed) minOff() int { return 2 * tileRows }

func (p *packed) scOff() int {
	if p.f.hasMin {
		return 4 * tileRows
	}
	return 2 * tileRows
}

func (p *packed) mnOff() int { return p.scOff() + p.nsub*tileRows }

func (p *packed) levelsOff() int {
	switch {
	case p.f.family == famLegacy:
		return p.scOff()
	case p.f.hasMin:
		return p.mnOff() + p.nsub*tileRows
	}
	return p.mnOff()
}

// pack repacks a weight stored as rows × rowBytes bytes of type f.typ,
// splitting the work over threads goroutines.
func pack(f *format, rows, cols int, src []byte, signed8 bool, threads int) (*packed, error) {
	if cols%f.block != 0 {
		return nil, fmt.Errorf("%d columns is not a whole number of %s blocks", cols, f.typ)
	}
	rb, err := f.typ.RowBytes(uint64(cols))
	if err != nil {
		return nil, err
	}
	if len(src) != rows*int(rb) {
		return nil, fmt.Errorf("%d bytes for %d rows of %d %s", len(src), rows, cols, f.typ)
	}
	p := &packed{f: f, rows: rows, cols: cols, tiles: (rows + tileRows - 1) / tileRows, nb: cols / f.block,
		signed8: signed8 && f.offset == 128 && !f.u4}
	switch f.family {
	case famLegacy:
		p.blockBytes = p.levelsOff() + f.groupBytes()
	case famK:
		p.nsub = 256 / f.sub
		p.blockBytes = p.levelsOff() + 8*f.groupBytes()
	case famFloat:
		p.blockBytes = tileRows * f.elem
	}
	p.tileBytes = p.nb * p.blockBytes
	p.variant = variantOf(p)
	p.data = make([]byte, p.tiles*p.tileBytes)
	var wg sync.WaitGroup
	per := (p.tiles + threads - 1) / max(threads, 1)
	for t0 := 0; t0 < p.tiles; t0 += per {
		wg.Add(1)
		go func(t0, t1 int) {
			defer wg.Done()
			for t := t0; t < t1; t++ {
				for r := 0; r < tileRows && t*tileRows+r < rows; r++ {
					row := t*tileRows + r
					p.packRow(p.data[t*p.tileBytes:(t+1)*p.tileBytes], r, src[row*int(rb):(row+1)*int(rb)])
				}
			}
		}(t0, min(t0+per, p.tiles))
	}
	wg.Wait()
	return p, nil
}

// packRow writes one stored row as lane r of a tile.
func (p *packed) packRow(tile []byte, r int, row []byte) {
	f := p.f
	flip := uint8(0)
	if p.signed8 {
		flip = 0x80
	}
	switch f.family {
	case famFloat:
		for k := 0; k < p.cols; k++ {
			copy(tile[k*p.blockBytes+r*f.elem:], row[k*f.elem:(k+1)*f.elem])
		}
	case famLegacy:
		var q [32]uint8
		bb := int(f.typ.BlockBytes())
		for b := 0; b < p.nb; b++ {
			blk := tile[b*p.blockBytes:]
			d, m := f.legacy(row[b*bb:(b+1)*bb], &q)
			binary.LittleEndian.PutUint16(blk[2*r:], d)
			if f.hasMin {
				binary.LittleEndian.PutUint16(blk[p.minOff()+2*r:], m)
			}
			putLevels(blk[p.levelsOff():], r, q[:], f, flip)
		}
	case famK:
		var q [256]uint8
		var sc [16]int8
		var mn [16]uint8
		bb := int(f.typ.BlockBytes())
		for b := 0; b < p.nb; b++ {
			blk := tile[b*p.blockBytes:]
			d, dmin := f.kquant(row[b*bb:(b+1)*bb], &q, &sc, &mn)
			binary.LittleEndian.PutUint16(blk[2*r:], d)
			if f.hasMin {
				binary.LittleEndian.PutUint16(blk[p.minOff()+2*r:], dmin)
			}
			for s := range p.nsub {
				blk[p.scOff()+s*tileRows+r] = uint8(sc[s])
				if f.hasMin {
					blk[p.mnOff()+s*tileRows+r] = mn[s]
				}
			}
			gb := f.groupBytes()
			for g := range 8 {
				putLevels(blk[p.levelsOff()+g*gb:], r, q[32*g:32*g+32], f, flip)
			}
		}
	}
}

// putLevels stores the 32 levels q of lane r in the u4 or u8 layout.
func putLevels(dst []byte, r int, q []uint8, f *format, flip uint8) {
	if f.u4 {
		for k := range 16 {
			dst[(k/4)*32+r*4+k%4] = q[k]&0xf | q[k+16]<<4
		}
		for k, v := range q {
			t, i := k/4, k%4
			switch f.hbits {
			case 1:
				dst[128+r*4+i] |= (v >> 4 & 1) << t
			case 2:
				dst[128+(t/4)*32+r*4+i] |= (v >> 4 & 3) << (2 * (t % 4))
			}
		}
		return
	}
	for k := range 32 {
		dst[(k/4)*32+r*4+k%4] = q[k] ^ flip
	}
}

// variantOf names the kernel variant of a packed matrix within its
// family: the float type, or the sub-block size (k-quants) and the level
// form.
func variantOf(p *packed) string {
	f := p.f
	if f.family == famFloat {
		return f.typ.String()
	}
	v := "U8"
	switch {
	case p.signed8:
		v = "S8"
	case f.u4 && f.hbits > 0:
		v = fmt.Sprint("U4H", f.hbits)
	case f.u4:
		v = "U4"
	}
	if f.hasMin {
		v += "Min"
	}
	if f.family == famK {
		return fmt.Sprint(f.sub, v)
	}
	return v
}
