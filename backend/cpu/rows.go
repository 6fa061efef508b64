package cpu

import (
	"fmt"

	"github.com/weftlm/weft/backend"
)

// WriteRows implements backend.RowWriter.
func (e *exec) WriteRows(buf backend.BufID, src []float32) error {
	if e.pool == nil {
		return errClosed
	}
	if buf < 0 || int(buf) >= len(e.bufs) {
		return fmt.Errorf("cpu: buffer %d out of range", buf)
	}
	if len(src) > len(e.bufs[buf]) || len(src)%e.p.Bufs[buf] != 0 {
		return fmt.Errorf("cpu: %d floats do not fill whole rows of buffer %d (%d columns, %d rows)", len(src), buf, e.p.Bufs[buf], e.p.MaxRows)
	}
	copy(e.bufs[buf], src)
	return nil
}
