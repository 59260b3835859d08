package binlog

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"tidemark"
)

// A MariaDB XA transaction prepared before a snapshot's position and
// committed after it is in no part of what a first run reads: its rows are
// not visible to the snapshot's reads (it was not committed), and its XA
// PREPARE group, which carries the rows, is in the binlog before the
// position the stream starts from, so the stream meets only its XA COMMIT
// (mariaxa.go stops there; nemesis seed 198201436100). Capture therefore
// checks, after reading the position P, that no XA transaction was prepared
// across it:
//
//  1. XA RECOVER lists the transactions prepared now;
//  2. SHOW MASTER STATUS gives P2, the binlog's end after that;
//  3. the events in [P, P2) are read: each XA END / XA PREPARE there is of
//     a transaction prepared after P (its rows are in the stream).
//
// A transaction prepared before P and not committed at P is either still
// prepared at step 1 (listed, and not prepared in [P, P2)) or it committed
// or rolled back between P and step 1 (its XA COMMIT/ROLLBACK is in
// [P, P2), its XA PREPARE is not). Either way the capture is taken again
// after a pause, until xaCaptureWait has passed; then it fails naming the
// transactions. A binlog that rotated between P and P2 is read as "not
// proven", and the capture is taken again too.

// xaCaptureWait bounds how long Capture waits for XA transactions prepared
// across its position to be resolved.
var xaCaptureWait = 60 * time.Second

var xaEventRE = regexp.MustCompile(`^XA (END|PREPARE|COMMIT|ROLLBACK) (X'[0-9A-Fa-f]*',X'[0-9A-Fa-f]*',[0-9]+)`)

// xaAcross returns the XA transactions prepared before file:pos and not
// committed at it (see above), or a reason why that could not be proven
// (as one entry).
func (r *Reader) xaAcross(ctx context.Context, file string, pos uint64) ([]string, error) {
	res, err := r.t.query(ctx, "XA RECOVER")
	if err != nil {
		return nil, fmt.Errorf("xa recover: %w", err)
	}
	prepared := map[string]bool{}
	for i := 0; i < res.RowNumber(); i++ {
		format, _ := res.GetInt(i, 0)
		gl, _ := res.GetInt(i, 1)
		bl, _ := res.GetInt(i, 2)
		data, _ := res.GetString(i, 3)
		if gl < 0 || bl < 0 || int(gl+bl) > len(data) {
			return nil, fmt.Errorf("xa recover: row %d: data of %d bytes for gtrid %d and bqual %d bytes", i, len(data), gl, bl)
		}
		prepared[fmt.Sprintf("X'%x',X'%x',%d", data[:gl], data[gl:gl+bl], format)] = true
	}
	res, err = r.t.query(ctx, "SHOW MASTER STATUS")
	if err != nil {
		return nil, fmt.Errorf("show master status: %w", err)
	}
	if res.RowNumber() == 0 {
		return nil, fmt.Errorf("SHOW MASTER STATUS is empty (log_bin off?): %w", tidemark.ErrSourceConfig)
	}
	file2, _ := res.GetString(0, 0)
	pos2, _ := res.GetUint(0, 1)
	if file2 != file {
		return []string{fmt.Sprintf("(the binlog rotated from %s to %s while the position was checked)", file, file2)}, nil
	}
	after := map[string]bool{} // prepared in [pos, pos2)
	var open []string
	for from := pos; from < pos2; {
		res, err := r.t.query(ctx, fmt.Sprintf("SHOW BINLOG EVENTS IN '%s' FROM %d LIMIT 1000", strings.ReplaceAll(file, "'", "''"), from))
		if err != nil {
			return nil, fmt.Errorf("show binlog events in %s from %d: %w", file, from, err)
		}
		if res.RowNumber() == 0 {
			break
		}
		next := from
		for i := 0; i < res.RowNumber(); i++ {
			at, _ := res.GetUint(i, 1)
			end, _ := res.GetUint(i, 4)
			info, _ := res.GetString(i, 5)
			if at >= pos2 {
				next = pos2
				break
			}
			if end > next {
				next = end
			}
			m := xaEventRE.FindStringSubmatch(info)
			if m == nil {
				continue
			}
			xid := strings.ReplaceAll(strings.ToLower(m[2]), "x'", "X'") // as fmt's %x writes the hex
			switch m[1] {
			case "END", "PREPARE":
				after[xid] = true
			default:
				if !after[xid] {
					open = append(open, xid)
				}
			}
		}
		if next <= from {
			break
		}
		from = next
	}
	for xid := range prepared {
		if !after[xid] {
			open = append(open, xid)
		}
	}
	sort.Strings(open)
	return open, nil
}

// captureOutsideXA runs capture until no XA transaction was prepared across
// its position (MariaDB; see above).
func (r *Reader) captureOutsideXA(ctx context.Context, capture func(ctx context.Context) (string, uint64, string, string, error)) (file string, pos uint64, gtid, now string, err error) {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		if file, pos, gtid, now, err = capture(ctx); err != nil || r.t.cfg.Flavor != FlavorMariaDB {
			return file, pos, gtid, now, err
		}
		var open []string
		err = tidemark.Retry(ctx, "check XA transactions at the position", queryRetry, isTransient, r.t.rl, func(ctx context.Context) error {
			var err error
			open, err = r.xaAcross(ctx, file, pos)
			return err
		})
		if err != nil || len(open) == 0 {
			return file, pos, gtid, now, err
		}
		if time.Since(start) >= xaCaptureWait {
			return "", 0, "", "", fmt.Errorf("XA transaction %s was prepared before the snapshot's position %s:%d and not committed at it, for %s: its rows would be in no read of the snapshot, and its XA PREPARE before the position the stream starts from; resolve it on the source (XA RECOVER, then XA COMMIT or XA ROLLBACK) and start again", strings.Join(open, ", "), file, pos, xaCaptureWait)
		}
		r.t.rl.Warn("waiting for XA transactions prepared across the snapshot's position to be resolved", "source", r.t.cfg.Name, "xa", strings.Join(open, ", "), "position", fmt.Sprintf("%s:%d", file, pos), "attempt", attempt)
		t := time.NewTimer(tidemark.Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}.Delay(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return "", 0, "", "", ctx.Err()
		case <-t.C:
		}
	}
}
