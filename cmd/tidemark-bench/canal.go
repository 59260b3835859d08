package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/canal"
	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-mysql-org/go-mysql/schema"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/integration/harness"
)

// canalBaseline is C3b: the consumer a competent engineer writes in a day
// with go-mysql's canal. Rows are gathered per source transaction; at a
// transaction boundary, once 1,000 rows or 100 ms have gathered, they are
// written in one PostgreSQL transaction as multi-row
// INSERT … ON CONFLICT (id) DO UPDATE statements (rows coalesced by key, at
// most 5,000 rows per statement), together with the binlog position.
// DATETIME is rebuilt in the source zone and TIMESTAMP taken as the instant
// it is, so its output is correct for this table. It is not linked into
// tidemark: it lives in the bench only.
func canalBaseline(ctx context.Context, env harness.Env, pg *pgx.Conn, from, to tidemark.Position, want int) (result, error) {
	if _, err := pg.Exec(ctx, `CREATE TABLE bench_ceiling.canal (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL,
		created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, name text NOT NULL, doc jsonb);
		CREATE TABLE bench_ceiling.canal_position (name text PRIMARY KEY, gtid text NOT NULL)`); err != nil {
		return result{}, err
	}
	cfg := canal.NewDefaultConfig()
	cfg.Addr, cfg.User, cfg.Password = env.MySQLAddr, env.MySQLUser, env.MySQLPassword
	cfg.Flavor, cfg.ServerID = "mariadb", 7400
	cfg.Dump.ExecutionPath = ""
	cfg.IncludeTableRegex = []string{benchDB + `\.ins`}
	cfg.ParseTime = true
	cfg.TimestampStringLocation = time.UTC
	cfg.Logger = slog.New(slog.DiscardHandler)
	c, err := canal.NewCanal(cfg)
	if err != nil {
		return result{}, fmt.Errorf("canal: %w", err)
	}
	defer c.Close()
	loc, _ := time.LoadLocation(zone)
	h := &canalHandler{ctx: ctx, pg: pg, loc: loc, end: seqOf(to), done: make(chan error, 1), rows: map[int64][]any{}}
	c.SetEventHandler(h)
	gs, err := mysql.ParseMariadbGTIDSet(from.GTID)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- c.StartFromGTID(gs) }()
	select {
	case err = <-h.done:
	case err = <-runErr:
		if err == nil {
			err = fmt.Errorf("canal stopped before the end of the backlog")
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	took := time.Since(start)
	if err != nil {
		return result{}, fmt.Errorf("canal baseline: %w", err)
	}
	var n int
	if err := pg.QueryRow(ctx, "SELECT count(*) FROM bench_ceiling.canal").Scan(&n); err != nil {
		return result{}, err
	}
	if n != want {
		return result{}, fmt.Errorf("canal baseline wrote %d rows, want %d", n, want)
	}
	return result{name: "C3b canal + batched multi-row upsert", rows: h.written, took: took,
		extra: fmt.Sprintf("%d PostgreSQL transactions", h.txns)}, nil
}

type canalHandler struct {
	canal.DummyEventHandler
	ctx     context.Context
	pg      *pgx.Conn
	loc     *time.Location
	end     uint64
	seq     uint64
	gtid    string
	cols    []string
	kinds   []int
	rows    map[int64][]any // pending rows by id (coalesced)
	order   []int64
	first   time.Time
	written int
	txns    int
	done    chan error
	stopped bool
}

func (h *canalHandler) String() string { return "bench canal baseline" }

func (h *canalHandler) OnGTID(_ *replication.EventHeader, e mysql.BinlogGTIDEvent) error {
	if g, ok := e.(*replication.MariadbGTIDEvent); ok {
		h.seq = g.GTID.SequenceNumber
		h.gtid = fmt.Sprintf("%d-%d-%d", g.GTID.DomainID, g.GTID.ServerID, g.GTID.SequenceNumber)
	}
	return nil
}

func (h *canalHandler) OnRow(e *canal.RowsEvent) error {
	if h.cols == nil {
		for _, c := range e.Table.Columns {
			h.cols = append(h.cols, c.Name)
			h.kinds = append(h.kinds, c.Type)
		}
	}
	if len(h.rows) == 0 {
		h.first = time.Now()
	}
	add := func(r []any) {
		row := make([]any, len(r))
		for i, v := range r {
			row[i] = v
			if t, ok := v.(time.Time); ok && h.kinds[i] == schema.TYPE_DATETIME {
				// go-mysql labels DATETIME's wall clock UTC: rebuild it in the source zone.
				row[i] = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), h.loc)
			}
		}
		id := row[0].(int64)
		if _, ok := h.rows[id]; !ok {
			h.order = append(h.order, id)
		}
		h.rows[id] = row
	}
	switch e.Action {
	case canal.InsertAction:
		for _, r := range e.Rows {
			add(r)
		}
	case canal.UpdateAction:
		for i := 1; i < len(e.Rows); i += 2 {
			add(e.Rows[i])
		}
	}
	return nil
}

func (h *canalHandler) OnXID(*replication.EventHeader, mysql.Position) error {
	if h.stopped {
		return nil
	}
	last := h.seq >= h.end
	if len(h.rows) >= 1000 || (len(h.rows) > 0 && time.Since(h.first) >= 100*time.Millisecond) || last {
		if err := h.flush(); err != nil {
			h.stopped = true
			h.done <- err
			return err
		}
	}
	if last {
		h.stopped = true
		h.done <- nil
	}
	return nil
}

func (h *canalHandler) flush() error {
	tx, err := h.pg.Begin(h.ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(h.ctx)
	var set []string
	for _, c := range h.cols[1:] {
		set = append(set, c+" = EXCLUDED."+c)
	}
	for lo := 0; lo < len(h.order); lo += 5000 {
		ids := h.order[lo:min(lo+5000, len(h.order))]
		var sb strings.Builder
		sb.WriteString("INSERT INTO bench_ceiling.canal (" + strings.Join(h.cols, ", ") + ") VALUES ")
		args := make([]any, 0, len(ids)*len(h.cols))
		for i, id := range ids {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteByte('(')
			for j := range h.cols {
				if j > 0 {
					sb.WriteString(", ")
				}
				fmt.Fprintf(&sb, "$%d", len(args)+1)
				args = append(args, h.rows[id][j])
			}
			sb.WriteByte(')')
		}
		sb.WriteString(" ON CONFLICT (id) DO UPDATE SET " + strings.Join(set, ", "))
		if _, err := tx.Exec(h.ctx, sb.String(), args...); err != nil {
			return fmt.Errorf("upsert %d rows: %w", len(ids), err)
		}
		h.written += len(ids)
	}
	if _, err := tx.Exec(h.ctx, `INSERT INTO bench_ceiling.canal_position VALUES ('bench', $1)
		ON CONFLICT (name) DO UPDATE SET gtid = EXCLUDED.gtid`, h.gtid); err != nil {
		return err
	}
	if err := tx.Commit(h.ctx); err != nil {
		return err
	}
	h.txns++
	clear(h.rows)
	h.order = h.order[:0]
	return nil
}
