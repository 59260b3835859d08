package integration

// Shared machinery of the reliability suite (docs/RELIABILITY.md): the
// invariants I1–I6 every scenario checks, the evidence they are checked on
// (a GTID ledger, a control-table monitor, a version-regression trigger),
// load generators that survive server restarts, and the figures each
// scenario reports.
//
//	I1 target equals source by row-level checksum: missing = extra = changed = 0
//	I2 no business key appears twice in the target
//	I3 a stored watermark is never ahead of committed data and never moves backwards
//	I4 the checkpoint never points past committed data (and never moves backwards)
//	I5 no older version of a row is applied after a newer one
//	I6 an unrecoverable gap exits non-zero with a clear error; nothing is skipped silently

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"go.yaml.in/yaml/v3"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// longProfile skips a test unless TIDEMARK_LONG=1 (make test-long). Only
// the long profile of a scenario calls it: its quick profile always runs.
func longProfile(t *testing.T) {
	t.Helper()
	if os.Getenv("TIDEMARK_LONG") != "1" {
		t.Skip("long profile: run `make test-long` (TIDEMARK_LONG=1); the quick profile of this scenario runs in `make test`")
	}
}

// ---------------------------------------------------------------------------
// daemon configuration

// relOpts shapes a reliability-suite daemon config.
type relOpts struct {
	Addr        string // source address (default: the local MariaDB; a fault proxy for F8)
	Zone        string // source time zone (default UTC)
	Start       tidemark.Position
	Heartbeat   string // default 1s
	ReadTimeout string // default: the daemon's (3 × heartbeat)
	DeleteMode  string // hard (default) or soft
	Level       string // log level (default info)
	Extra       string // more top-level YAML (fallback:, batch: ...)
	NoBatch     bool   // leave the batch section out (Extra has one)
	Source      []string
	// TargetSchema is the PostgreSQL schema (default: the database name).
	TargetSchema string
}

// relConfig writes a daemon config for database db (all its tables) into
// the target schema of the same name, with the checkpoint row named source.
// The target DSN comes from ${TM_IT_PG_DSN} (startDaemon sets it; pass
// "TM_IT_PG_DSN=..." as extra env to point it at a proxy).
func (f *fixture) relConfig(t *testing.T, source, db string, o relOpts) string {
	t.Helper()
	if o.Addr == "" {
		o.Addr = f.env.MySQLAddr
	}
	if o.Zone == "" {
		o.Zone = "UTC"
	}
	if o.Heartbeat == "" {
		o.Heartbeat = "1s"
	}
	if o.Level == "" {
		o.Level = "info"
	}
	if o.TargetSchema == "" {
		o.TargetSchema = db
	}
	hb, err := time.ParseDuration(o.Heartbeat)
	if err != nil {
		t.Fatalf("relOpts.Heartbeat: %v", err)
	}
	d := testenv.Daemon{
		Source: testenv.Source{Name: source, Flavor: f.flavor(), Addr: o.Addr, User: f.env.MySQLUser,
			Password: "${TM_IT_MYSQL_PASSWORD}", ServerID: testenv.ServerID(), TimeZone: o.Zone,
			Include: []string{db + ".*"}, Heartbeat: hb, More: map[string]any{}},
		Target: testenv.Target{Postgres: &testenv.Postgres{DSN: "${TM_IT_PG_DSN}", Schema: o.TargetSchema, DeleteMode: o.DeleteMode}},
		Log:    &testenv.Log{Level: o.Level},
		// Metrics nil: "off" unless o.Extra has a metrics section (daemons
		// run one after another: no fixed metrics port).
		Extra: o.Extra,
	}
	if !o.Start.IsZero() {
		d.Source.StartPosition = o.Start.String()
	}
	if o.ReadTimeout != "" {
		if d.Source.ReadTimeout, err = time.ParseDuration(o.ReadTimeout); err != nil {
			t.Fatalf("relOpts.ReadTimeout: %v", err)
		}
	}
	for _, l := range o.Source {
		var kv map[string]any
		if err := yaml.Unmarshal([]byte(l), &kv); err != nil {
			t.Fatalf("relOpts.Source %q: %v", l, err)
		}
		maps.Copy(d.Source.More, kv)
	}
	if !o.NoBatch {
		d.Batch = &testenv.Batch{MaxDelay: 50 * time.Millisecond}
	}
	return d.Write(t)
}

// ---------------------------------------------------------------------------
// connections that survive server restarts

// reconnectPG replaces the fixture's PostgreSQL connection (after a
// PostgreSQL restart), retrying for up to 60 s.
func (f *fixture) reconnectPG(t *testing.T) {
	t.Helper()
	c, err := dialPG(f.ctx, f.env, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old := f.pg
	f.pg = c
	_ = old.Close(f.ctx)
	t.Cleanup(func() { c.Close(context.Background()) })
}

// reconnectMy replaces the fixture's MariaDB connection (after a restart).
func (f *fixture) reconnectMy(t *testing.T) {
	t.Helper()
	c, err := dialMy(f.env, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	old := f.my
	f.my = c
	_ = old.Close()
	t.Cleanup(func() { c.Close() })
}

func dialPG(ctx context.Context, env harness.Env, timeout time.Duration) (*pgx.Conn, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := env.PG(ctx)
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func dialMy(env harness.Env, timeout time.Duration) (*client.Conn, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := env.MySQL()
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// load

// loadRunner runs a harness.Workload on its own connection until stopped.
// With resilient set, a failed step (the server restarting, a proxy
// fault) reconnects and goes on; the step's outcome is then unknown, which
// the checks never rely on (they read the source itself).
type loadRunner struct {
	w         *harness.Workload
	env       harness.Env
	resilient bool
	pause     time.Duration // between steps (0: flat out)

	stop     chan struct{}
	done     chan error
	failures int
}

func startLoad(t *testing.T, env harness.Env, w *harness.Workload, resilient bool, pause time.Duration) *loadRunner {
	t.Helper()
	l := &loadRunner{w: w, env: env, resilient: resilient, pause: pause, stop: make(chan struct{}), done: make(chan error, 1)}
	go l.run()
	t.Cleanup(func() { l.Stop() })
	return l
}

func (l *loadRunner) run() {
	for {
		select {
		case <-l.stop:
			l.done <- nil
			return
		default:
		}
		err := l.w.Step()
		if err != nil {
			if !l.resilient {
				l.done <- err
				return
			}
			l.failures++
			_ = l.w.My.Close()
			c, derr := dialMy(l.env, 90*time.Second)
			if derr != nil {
				l.done <- fmt.Errorf("workload: reconnect after %v: %w", err, derr)
				return
			}
			l.w.My = c
			if err := l.w.Resume(); err != nil {
				l.done <- err
				return
			}
		}
		if l.pause > 0 {
			time.Sleep(l.pause)
		}
	}
}

// Stop stops the load and returns its error, once.
func (l *loadRunner) Stop() error {
	select {
	case <-l.stop:
		return nil
	default:
	}
	close(l.stop)
	return <-l.done
}

// newWorkload creates db.orders (harness.Workload) on a connection of its own.
func newWorkload(t *testing.T, f *fixture, db, zone string, bigTx int) *harness.Workload {
	t.Helper()
	my, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	w := &harness.Workload{My: my, Database: db, Zone: zone, Rand: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 77)), BigTxRows: bigTx}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	return w
}

// ---------------------------------------------------------------------------
// I4 evidence: a GTID ledger

// ledger inserts rows into db.ticks, one autocommit transaction each, and
// records the GTID sequence number each committed with (@@last_gtid). A
// checkpoint at GTID sequence S claims every tick with a sequence ≤ S is in
// the target; the monitor checks that claim in the same snapshot as the
// checkpoint. Ticks whose commit outcome is unknown (the server went away)
// are not recorded, so they are never asserted.
type ledger struct {
	env harness.Env
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

// newLedger creates db.ticks (db must exist) and writes the first tick.
func newLedger(t *testing.T, f *fixture, db string) *ledger {
	t.Helper()
	if err := harness.Exec(f.my, "CREATE TABLE "+db+"."+strings.TrimPrefix(ticksDDL, "CREATE TABLE ")); err != nil {
		t.Fatal(err)
	}
	l := &ledger{env: f.env, db: db, next: 1, stop: make(chan struct{}), done: make(chan struct{})}
	my, err := f.env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.tick(my); err != nil {
		t.Fatal(err)
	}
	my.Close()
	return l
}

func (l *ledger) tick(my *client.Conn) error {
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

// start ticks every interval until Stop, reconnecting after errors.
func (l *ledger) start(t *testing.T, interval time.Duration) {
	t.Helper()
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
	t.Cleanup(l.Stop)
}

func (l *ledger) Stop() {
	select {
	case <-l.stop:
		return
	default:
	}
	close(l.stop)
	<-l.done
}

// covered returns the committed tick ids whose GTID sequence is ≤ seq
// (the most recent 2000 of them) and how many there are in all.
func (l *ledger) covered(seq uint64) ([]int64, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := sort.Search(len(l.seqs), func(i int) bool { return l.seqs[i] > seq })
	lo := max(n-2000, 0)
	return append([]int64(nil), l.ids[lo:n]...), n
}

// ---------------------------------------------------------------------------
// I3/I4 monitor

// monitor polls the control tables while a scenario runs and records every
// violation of I3 and I4:
//   - the checkpoint moves backwards, or is ahead of the source's
//     @@gtid_binlog_pos (read after it);
//   - the checkpoint claims a tick (ledger) the target does not hold, in
//     the same REPEATABLE READ snapshot;
//   - a watermark moves backwards or is ahead of committed data: a source
//     row of the table whose watermark column is ≤ the watermark (read
//     after the target snapshot) is missing from the target snapshot.
type monitor struct {
	env    harness.Env
	source string
	db     string
	led    *ledger
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

func startMonitor(t *testing.T, f *fixture, source, db string, led *ledger) *monitor {
	t.Helper()
	m := &monitor{env: f.env, source: source, db: db, led: led, lastWM: map[string]time.Time{}, wmCol: map[string]string{}, zone: "UTC",
		stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	t.Cleanup(m.Stop)
	return m
}

// watchWatermark adds I3 checks of table's watermark (column written in
// zone).
func (m *monitor) watchWatermark(table, column, zone string) {
	m.mu.Lock()
	m.wmCol[table] = column
	m.zone = zone
	m.mu.Unlock()
}

func (m *monitor) violate(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.violations) < 50 {
		m.violations = append(m.violations, fmt.Sprintf(format, args...))
	}
}

func (m *monitor) run() {
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

func (m *monitor) poll(ctx context.Context, pg *pgx.Conn, my *client.Conn) error {
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
		src, err := harness.SourcePosition(my)
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
				ids, n := m.led.covered(seq)
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

func (m *monitor) pollWatermarks(ctx context.Context, tx pgx.Tx, my *client.Conn) error {
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
		local := wm.In(mustZone(zone)).Format("2006-01-02 15:04:05.999999")
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

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// Stop stops polling.
func (m *monitor) Stop() {
	select {
	case <-m.stop:
		return
	default:
	}
	close(m.stop)
	<-m.done
}

// check stops the monitor and fails the test on any violation.
func (m *monitor) check(t *testing.T) {
	t.Helper()
	m.Stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.violations) > 0 {
		t.Errorf("I3/I4 violations (%d polls):\n  %s", m.polls, strings.Join(m.violations, "\n  "))
	}
	if m.led != nil && m.checked == 0 {
		t.Errorf("I4 monitor never verified a checkpoint against the ledger (%d polls)", m.polls)
	}
	t.Logf("I3/I4 monitor: %d polls, %d ledger checks, 0 violations", m.polls, m.checked)
}

// ---------------------------------------------------------------------------
// I5: a version-regression trigger

// i5Setup creates, in schema, the tables the I5 trigger records into and the
// trigger function: it records every UPDATE that lowers (_tm_seq, _tm_idx)
// and every INSERT of a key whose deleted version (kept in
// <schema>.rel_i5_tomb) is newer: an older version applied after a newer
// one. The trigger's arguments name the business-key columns.
func i5Setup(t *testing.T, f *fixture, schema string) {
	t.Helper()
	if _, err := f.pg.Exec(f.ctx, harness.I5SetupSQL(schema)); err != nil {
		t.Fatalf("set up I5 in %s: %v", schema, err)
	}
}

// installI5 puts the I5 trigger (i5Setup) on an existing target table.
func installI5(t *testing.T, f *fixture, schema, table string, key ...string) {
	t.Helper()
	i5Setup(t, f, schema)
	if _, err := f.pg.Exec(f.ctx, harness.I5InstallSQL(schema, table, key...)); err != nil {
		t.Fatalf("install I5 trigger on %s.%s: %v", schema, table, err)
	}
}

// watchI5 puts the I5 trigger on every table the daemon creates in schema
// from now on (an event trigger on CREATE TABLE, keyed by the table's
// primary key), so that I5 also watches the first snapshot or the first
// rows streamed, not only what comes after the tables exist.
func watchI5(t *testing.T, f *fixture, schema string) {
	t.Helper()
	i5Setup(t, f, schema)
	ev := "rel_i5_" + schema
	if _, err := f.pg.Exec(f.ctx, harness.I5WatchSQL(schema, ev)); err != nil {
		t.Fatalf("watch I5 in %s: %v", schema, err)
	}
	t.Cleanup(func() {
		_, _ = f.pg.Exec(context.Background(), "DROP EVENT TRIGGER IF EXISTS "+pgx.Identifier{ev}.Sanitize())
	})
}

// i5Watched fails the test unless every listed target table carries the
// I5 trigger (watchI5 attached it when the daemon created the table).
func i5Watched(t *testing.T, f *fixture, schema string, tables ...string) {
	t.Helper()
	for _, tbl := range tables {
		var n int
		if err := f.pg.QueryRow(f.ctx, "SELECT count(*) FROM pg_trigger WHERE tgname = 'rel_i5' AND tgrelid = to_regclass($1)", pgx.Identifier{schema, tbl}.Sanitize()).Scan(&n); err != nil || n != 1 {
			t.Fatalf("I5 trigger on %s.%s: %d (%v)", schema, tbl, n, err)
		}
	}
}

// checkI5 fails the test if the trigger recorded a regression.
// allowResurrect accepts (and counts) inserts of keys whose deleted version
// is newer; since hard deletes keep tombstones (sink/postgres/tombstones.go)
// no test needs it.
func checkI5(t *testing.T, f *fixture, schema string, allowResurrect bool) (regressions, resurrections int) {
	t.Helper()
	regressions, resurrections, bad, err := readI5(f, schema, allowResurrect)
	if err != nil {
		t.Fatalf("read I5 records: %v", err)
	}
	if len(bad) > 0 {
		t.Errorf("I5: an older version was applied after a newer one (%d regressions, %d resurrections):\n  %s", regressions, resurrections, strings.Join(bad, "\n  "))
	}
	return regressions, resurrections
}

// readI5 returns what the I5 trigger recorded in schema.
func readI5(f *fixture, schema string, allowResurrect bool) (regressions, resurrections int, bad []string, err error) {
	return harness.ReadI5(f.ctx, f.pg, schema, allowResurrect)
}

// ---------------------------------------------------------------------------
// I1/I2

// checkEqual compares tables of db (I1: row-level checksum, I2: duplicate
// business keys) and returns the diffs.
func (f *fixture) checkEqual(t *testing.T, specs ...harness.TableSpec) []*harness.Diff {
	t.Helper()
	var out []*harness.Diff
	for _, spec := range specs {
		d, err := harness.Compare(f.ctx, f.my, f.pg, spec)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Equal() {
			t.Errorf("I1/I2: target differs from source: %s\n%s", d, strings.Join(d.Examples, "\n"))
		}
		// I2 independently of the comparison's key map: count duplicate
		// business keys with SQL.
		keys := spec.Key
		if len(keys) == 0 {
			keys = f.primaryKey(t, spec.Database, spec.Table)
		}
		schema := spec.TargetSchema
		if schema == "" {
			schema = spec.Database
		}
		var k []string
		for _, c := range keys {
			k = append(k, pgx.Identifier{c}.Sanitize())
		}
		var dups int
		q := fmt.Sprintf("SELECT count(*) FROM (SELECT 1 FROM %s GROUP BY %s HAVING count(*) > 1) d", pgx.Identifier{schema, spec.Table}.Sanitize(), strings.Join(k, ", "))
		if err := f.pg.QueryRow(f.ctx, q).Scan(&dups); err != nil {
			t.Fatal(err)
		}
		if dups != 0 {
			t.Errorf("I2: %d business keys of %s appear more than once in the target", dups, spec.Table)
		}
		out = append(out, d)
	}
	return out
}

func (f *fixture) primaryKey(t *testing.T, db, table string) []string {
	t.Helper()
	r, err := f.my.Execute("SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION", db, table)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := 0; i < r.RowNumber(); i++ {
		s, _ := r.GetString(i, 0)
		keys = append(keys, s)
	}
	if len(keys) == 0 {
		t.Fatalf("%s.%s has no primary key", db, table)
	}
	return keys
}

// ---------------------------------------------------------------------------
// daemon measurements

// hwmKiB returns VmHWM (peak resident set) of a running daemon from /proc
// (0 if gone). Read it before stopping or killing the daemon: getrusage's
// ru_maxrss of a child is no substitute on Linux, because exec records the
// high-water mark of the image it replaced — the forked test process.
func (d *daemonProc) hwmKiB() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// exited reports whether the daemon has exited (without waiting).
func (d *daemonProc) exited() bool {
	select {
	case <-d.waited:
		return true
	default:
		return false
	}
}

// caughtUpIn waits until the checkpoint reaches the source position read
// now, and returns how long that took (recovery/lag time).
func (f *fixture) caughtUpIn(t *testing.T, source string, d *daemonProc, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	target, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.WaitCaughtUp(f.untilExit(d), f.pg, "", source, target, timeout); err != nil {
		out := ""
		if d != nil {
			out = tail(d.stderr.String(), 60)
		}
		t.Fatalf("%v\ndaemon stderr (tail):\n%s", err, out)
	}
	return time.Since(start)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// countLines counts log lines containing sub.
func countLines(s, sub string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// ---------------------------------------------------------------------------
// figures

// figures are one scenario's measured numbers. They are logged and, with
// TIDEMARK_REL_REPORT=file, appended to that file as one JSON line (the
// source of docs/RELIABILITY.md's tables).
type figures map[string]any

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1)*p + 0.5)
	return s[i]
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func report(t *testing.T, scenario string, fig figures) {
	t.Helper()
	fig["scenario"] = scenario
	fig["test"] = t.Name()
	fig["at"] = time.Now().UTC().Format(time.RFC3339)
	b, _ := json.Marshal(fig)
	t.Logf("FIGURES %s", b)
	if p := os.Getenv("TIDEMARK_REL_REPORT"); p != "" && !t.Failed() {
		fh, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Errorf("write figures: %v", err)
			return
		}
		defer fh.Close()
		fmt.Fprintf(fh, "%s\n", b)
	}
}
