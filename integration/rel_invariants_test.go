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
// I3/I4: a GTID ledger and a monitor of the control tables (harness)

type (
	ledger  = harness.Ledger
	monitor = harness.Monitor
)

// newLedger creates db.ticks (db must exist) and writes the first tick.
func newLedger(t *testing.T, f *fixture, db string) *ledger {
	t.Helper()
	l, err := harness.NewLedger(f.env, f.my, db)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startLedger ticks every interval until the test ends (or led.Stop).
func startLedger(t *testing.T, led *ledger, interval time.Duration) {
	led.Start(interval)
	t.Cleanup(led.Stop)
}

func startMonitor(t *testing.T, f *fixture, source, db string, led *ledger) *monitor {
	t.Helper()
	m := harness.StartMonitor(f.env, source, db, led)
	t.Cleanup(m.Stop)
	return m
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// checkMonitor stops the monitor and fails the test on any violation.
func checkMonitor(t *testing.T, m *monitor, led *ledger) {
	t.Helper()
	violations, polls, checked := m.Result()
	if len(violations) > 0 {
		t.Errorf("I3/I4 violations (%d polls):\n  %s", polls, strings.Join(violations, "\n  "))
	}
	if led != nil && checked == 0 {
		t.Errorf("I4 monitor never verified a checkpoint against the ledger (%d polls)", polls)
	}
	t.Logf("I3/I4 monitor: %d polls, %d ledger checks, 0 violations", polls, checked)
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
