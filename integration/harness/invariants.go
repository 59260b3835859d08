package harness

// The reliability suite's I3/I4 evidence (docs/RELIABILITY.md), shared with
// the nemesis: a GTID ledger and a monitor of the control tables.
//
//	I3 a stored watermark is never ahead of committed data and never moves backwards
//	I4 the checkpoint never points past committed data (and never moves backwards)

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
)

func zoneOf(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		return time.UTC
	}
	return loc
}

// ---------------------------------------------------------------------------
// I4 evidence: a GTID ledger

// Ledger inserts rows into db.ticks, one autocommit transaction each, and
// records the GTID sequence number each committed with (@@last_gtid). A
// checkpoint at GTID sequence S claims every tick with a sequence ≤ S is in
// the target; the monitor checks that claim in the same snapshot as the
// checkpoint. Ticks whose commit outcome is unknown (the server went away)
// are not recorded, so they are never asserted.
type Ledger struct {
	env Env
	db  string

	mu      sync.Mutex
	ids     []int64  // committed tick ids, ascending
	seqs    []uint64 // their GTID sequence numbers, ascending
	next    int64
	unknown int

	stop chan struct{}
	done chan struct{}
}

const ticksDDL = "CREATE TABLE ticks (id BIGINT NOT NULL PRIMARY KEY, at DATETIME(6) NOT NULL, note VARCHAR(32))"

// TicksDDL is the ledger's table (in the database the ledger writes to).
const TicksDDL = ticksDDL

// NewLedger creates db.ticks (db must exist) and writes the first tick.
func NewLedger(env Env, my *client.Conn, db string) (*Ledger, error) {
	if err := Exec(my, "CREATE TABLE "+db+"."+strings.TrimPrefix(ticksDDL, "CREATE TABLE ")); err != nil {
		return nil, fmt.Errorf("create the ledger's table: %w", err)
	}
	l := &Ledger{env: env, db: db, next: 1, stop: make(chan struct{}), done: make(chan struct{})}
	c, err := env.MySQL()
	if err != nil {
		return nil, fmt.Errorf("connect the ledger: %w", err)
	}
	defer c.Close()
	if err := l.tick(c); err != nil {
		return nil, err
	}
	return l, nil
}

// LedgerOf is a ledger that claims the ticks ids committed at GTID
// sequences seqs (a monitor's self-test); it writes nothing.
func LedgerOf(env Env, db string, ids []int64, seqs []uint64) *Ledger {
	return &Ledger{env: env, db: db, ids: ids, seqs: seqs, stop: make(chan struct{}), done: make(chan struct{})}
}

// Ticks is how many ticks committed; Unknown how many had an unknown
// outcome (the server went away), never asserted.
func (l *Ledger) Ticks() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

func (l *Ledger) Unknown() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.unknown
}

func (l *Ledger) tick(my *client.Conn) error {
	id := l.next
	l.next++
	if _, err := my.Execute(fmt.Sprintf("INSERT INTO %s.ticks VALUES (%d, NOW(6), 'tick')", l.db, id)); err != nil {
		l.mu.Lock()
		l.unknown++
		l.mu.Unlock()
		return err
	}
	r, err := my.Execute("SELECT @@last_gtid")
	if err != nil {
		l.mu.Lock()
		l.unknown++
		l.mu.Unlock()
		return err
	}
	g, _ := r.GetString(0, 0)
	set, err := tidemark.ParseMariaDBGTIDSet(g)
	if err != nil || len(set) != 1 {
		return fmt.Errorf("ledger: unexpected @@last_gtid %q (%v)", g, err)
	}
	var seq uint64
	for _, x := range set {
		seq = x.Seq
	}
	l.mu.Lock()
	l.ids = append(l.ids, id)
	l.seqs = append(l.seqs, seq)
	l.mu.Unlock()
	return nil
}

// Start ticks every interval until Stop, reconnecting after errors.
func (l *Ledger) Start(interval time.Duration) {
	go func() {
		defer close(l.done)
		var my *client.Conn
		defer func() {
			if my != nil {
				my.Close()
			}
		}()
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(interval):
			}
			if my == nil {
				c, err := l.env.MySQL()
				if err != nil {
					continue
				}
				my = c
			}
			if err := l.tick(my); err != nil {
				my.Close()
				my = nil
			}
		}
	}()
}

// Stop stops ticking (once Start ran).
func (l *Ledger) Stop() {
	select {
	case <-l.stop:
		return
	default:
	}
	close(l.stop)
	<-l.done
}

// Covered returns the committed tick ids whose GTID sequence is ≤ seq
// (the most recent 2000 of them) and how many there are in all.
func (l *Ledger) Covered(seq uint64) ([]int64, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := sort.Search(len(l.seqs), func(i int) bool { return l.seqs[i] > seq })
	lo := max(n-2000, 0)
	return append([]int64(nil), l.ids[lo:n]...), n
}

// ---------------------------------------------------------------------------
// I3/I4 monitor

// Monitor polls the control tables while a scenario runs and records every
// violation of I3 and I4:
//   - the checkpoint moves backwards, or is ahead of the source's
//     @@gtid_binlog_pos (read after it);
//   - the checkpoint claims a tick (ledger) the target does not hold, in
//     the same REPEATABLE READ snapshot;
//   - a watermark moves backwards or is ahead of committed data: a source
//     row of the table whose watermark column is ≤ the watermark (read
//     after the target snapshot) is missing from the target snapshot.
type Monitor struct {
	env    Env
	source string
	db     string
	led    *Ledger
	wmCol  map[string]string // table → watermark column (DATETIME in zone)
	zone   string

	mu         sync.Mutex
	violations []string
	polls      int
	checked    int // polls that verified ledger ticks
	lastPos    tidemark.Position
	havePos    bool
	lastWM     map[string]time.Time

	stop chan struct{}
	done chan struct{}
}

// StartMonitor polls source's checkpoint (and the watermarks WatchWatermark
// names) of target schema db until Stop; led (or nil) is the ledger of
// db.ticks the checkpoint is checked against.
func StartMonitor(env Env, source, db string, led *Ledger) *Monitor {
	m := &Monitor{env: env, source: source, db: db, led: led, lastWM: map[string]time.Time{}, wmCol: map[string]string{}, zone: "UTC",
		stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m
}

// WatchWatermark adds I3 checks of table's watermark (column written in
// zone; the table is harness.Workload's orders, keyed by order_id and
// line_item_id).
func (m *Monitor) WatchWatermark(table, column, zone string) {
	m.mu.Lock()
	m.wmCol[table] = column
	m.zone = zone
	m.mu.Unlock()
}

func (m *Monitor) violate(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.violations) < 50 {
		m.violations = append(m.violations, fmt.Sprintf(format, args...))
	}
}

func (m *Monitor) run() {
	defer close(m.done)
	ctx := context.Background()
	var pg *pgx.Conn
	var my *client.Conn
	defer func() {
		if pg != nil {
			pg.Close(ctx)
		}
		if my != nil {
			my.Close()
		}
	}()
	for {
		select {
		case <-m.stop:
			return
		case <-time.After(25 * time.Millisecond):
		}
		if pg == nil {
			c, err := m.env.PG(ctx)
			if err != nil {
				continue
			}
			pg = c
		}
		if my == nil {
			c, err := m.env.MySQL()
			if err != nil {
				continue
			}
			my = c
		}
		if err := m.poll(ctx, pg, my); err != nil {
			if !pg.IsClosed() {
				pg.Close(ctx)
			}
			pg = nil
			my.Close()
			my = nil
		}
	}
}

func (m *Monitor) poll(ctx context.Context, pg *pgx.Conn, my *client.Conn) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := pg.BeginTx(pctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var posText *string
	if err := tx.QueryRow(pctx, "SELECT (SELECT position FROM tidemark.checkpoints WHERE source = $1)", m.source).Scan(&posText); err != nil {
		return err
	}
	m.mu.Lock()
	m.polls++
	m.mu.Unlock()
	if posText != nil {
		pos, err := tidemark.ParsePosition(*posText)
		if err != nil {
			m.violate("checkpoint %q does not parse: %v", *posText, err)
			return nil
		}
		m.mu.Lock()
		last, have := m.lastPos, m.havePos
		m.lastPos, m.havePos = pos, true
		m.mu.Unlock()
		if have {
			if c, err := (tidemark.Position{GTID: pos.GTID}).Compare(tidemark.Position{GTID: last.GTID}); err != nil || c < 0 {
				m.violate("I4: checkpoint moved backwards from %v to %v (%v)", last, pos, err)
			}
		}
		// Ahead of the source? The source position is read after the
		// checkpoint, and only grows.
		src, err := SourcePosition(my)
		if err != nil {
			return err
		}
		if c, err := (tidemark.Position{GTID: pos.GTID}).Compare(src); err != nil || c > 0 {
			m.violate("I4: checkpoint %v is ahead of the source position %v (%v)", pos, src, err)
		}
		// Ahead of the target's data?
		if m.led != nil && pos.GTID != "" {
			set, err := tidemark.ParseMariaDBGTIDSet(pos.GTID)
			if err == nil && len(set) == 1 {
				var seq uint64
				for _, g := range set {
					seq = g.Seq
				}
				ids, n := m.led.Covered(seq)
				if len(ids) > 0 {
					var have int
					q := fmt.Sprintf("SELECT count(*) FROM %s.ticks WHERE id = ANY($1)", pgx.Identifier{m.db}.Sanitize())
					if err := tx.QueryRow(pctx, q, ids).Scan(&have); err != nil {
						if strings.Contains(err.Error(), "does not exist") {
							m.violate("I4: checkpoint %v covers %d ticks but the target has no ticks table", pos, n)
							return nil
						}
						return err
					}
					if have != len(ids) {
						m.violate("I4: checkpoint %v (GTID seq %d) covers %d ticks up to id %d; the target holds only %d of the last %d",
							pos, seq, n, ids[len(ids)-1], have, len(ids))
					}
					m.mu.Lock()
					m.checked++
					m.mu.Unlock()
				}
			}
		}
	}
	return m.pollWatermarks(pctx, tx, my)
}

func (m *Monitor) pollWatermarks(ctx context.Context, tx pgx.Tx, my *client.Conn) error {
	m.mu.Lock()
	cols := make(map[string]string, len(m.wmCol))
	for k, v := range m.wmCol {
		cols[k] = v
	}
	zone := m.zone
	m.mu.Unlock()
	for table, col := range cols {
		var wm *time.Time
		if err := tx.QueryRow(ctx, "SELECT (SELECT value FROM tidemark.watermarks WHERE source = $1 AND database = $2 AND table_name = $3)", m.source, m.db, table).Scan(&wm); err != nil {
			return err
		}
		if wm == nil {
			continue
		}
		m.mu.Lock()
		last, ok := m.lastWM[table]
		m.lastWM[table] = *wm
		m.mu.Unlock()
		if ok && wm.Before(last) {
			m.violate("I3: watermark of %s moved backwards from %s to %s", table, last.UTC(), wm.UTC())
		}
		// Every source key with col ≤ watermark (read now, after the
		// target snapshot) must be in that snapshot: rows only get newer
		// values of col in these workloads, and deleted rows are gone from
		// the source too.
		local := wm.In(zoneOf(zone)).Format("2006-01-02 15:04:05.999999")
		r, err := my.Execute(fmt.Sprintf("SELECT order_id, line_item_id FROM %s.%s WHERE %s <= '%s' ORDER BY %s DESC LIMIT 500", m.db, table, col, local, col))
		if err != nil {
			return err
		}
		if r.RowNumber() == 0 {
			continue
		}
		var keys []string
		for i := 0; i < r.RowNumber(); i++ {
			a, _ := r.GetInt(i, 0)
			b, _ := r.GetInt(i, 1)
			keys = append(keys, fmt.Sprintf("%d-%d", a, b))
		}
		var have int
		q := fmt.Sprintf("SELECT count(*) FROM %s.%s WHERE (order_id::text || '-' || line_item_id::text) = ANY($1)", pgx.Identifier{m.db}.Sanitize(), pgx.Identifier{table}.Sanitize())
		if err := tx.QueryRow(ctx, q, keys).Scan(&have); err != nil {
			return err
		}
		if have != len(keys) {
			m.violate("I3: watermark of %s is %s but %d of the %d source rows at or below it are missing from the target", table, wm.UTC(), len(keys)-have, len(keys))
		}
	}
	return nil
}

// Stop stops polling.
func (m *Monitor) Stop() {
	select {
	case <-m.stop:
		return
	default:
	}
	close(m.stop)
	<-m.done
}

// Forget forgets the last checkpoint seen: it was deleted or replaced on
// purpose, so the next one may be older.
func (m *Monitor) Forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.havePos = false
}

// HavePos reports whether the monitor has read a checkpoint.
func (m *Monitor) HavePos() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.havePos
}

// Violations returns the violations recorded so far.
func (m *Monitor) Violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.violations...)
}

// Result stops the monitor and returns its violations, its polls and how
// many polls verified ledger ticks.
func (m *Monitor) Result() (violations []string, polls, checked int) {
	m.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.violations...), m.polls, m.checked
}
