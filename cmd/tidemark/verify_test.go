package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/integration/harness"
	"tidemark/sink/postgres"
)

// e2e is one test's source database, target schema and control schema,
// replicated by a real tailer → sink pipeline.
type e2e struct {
	t       *testing.T
	env     harness.Env
	my      *client.Conn
	pg      *pgx.Conn
	db      string // source database = target schema
	control string
	cfg     *Config
	start   tidemark.Position
}

func randomName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	env, err := harness.EnvFromOS()
	if err != nil {
		t.Fatal(err) // names the command that sets the environment
	}
	my, err := env.MySQL()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	ctx := context.Background()
	pg, err := env.PG(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close(context.Background()) })
	e := &e2e{t: t, env: env, my: my, pg: pg, db: randomName("vx_"), control: randomName("vxc_")}
	t.Cleanup(func() {
		_, _ = my.Execute("DROP DATABASE IF EXISTS " + e.db)
		c, err := env.PG(context.Background())
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+e.db+`" CASCADE`)
		_, _ = c.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+e.control+`" CASCADE`)
	})
	if e.start, err = harness.SourcePosition(my); err != nil {
		t.Fatal(err)
	}
	e.cfg = &Config{
		Source: SourceConfig{Name: "vt" + e.db[3:9], Addr: env.MySQLAddr, User: env.MySQLUser, Password: env.MySQLPassword,
			ServerID: 7400 + uint32(e.db[3])%50, TimeZone: "Asia/Kolkata", Include: []string{e.db + ".*"}, StartPosition: e.start.String()},
		Target: TargetConfig{Postgres: &PostgresConfig{DSN: env.PGDSN, ControlSchema: e.control}},
	}
	if err := e.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e.my1("CREATE DATABASE " + e.db)
	return e
}

func (e *e2e) my1(sqls ...string) {
	e.t.Helper()
	for _, q := range sqls {
		if _, err := e.my.Execute(q); err != nil {
			e.t.Fatalf("source: %s: %v", q, err)
		}
	}
}

func (e *e2e) pg1(sqls ...string) {
	e.t.Helper()
	for _, q := range sqls {
		if _, err := e.pg.Exec(context.Background(), q); err != nil {
			e.t.Fatalf("target: %s: %v", q, err)
		}
	}
}

// replicate runs the pipeline until it has committed everything the source
// has written so far, then stops it.
func (e *e2e) replicate() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bc, err := e.cfg.BinlogConfig()
	if err != nil {
		e.t.Fatal(err)
	}
	tailer, err := binlog.New(bc)
	if err != nil {
		e.t.Fatal(err)
	}
	store, err := checkpoint.New(checkpoint.Config{Schema: e.control})
	if err != nil {
		e.t.Fatal(err)
	}
	pc := e.cfg.PostgresSinkConfig()
	pc.Checkpoints, pc.Logger = store, slog.New(slog.DiscardHandler)
	sink, err := postgres.Open(ctx, pc)
	if err != nil {
		e.t.Fatal(err)
	}
	defer sink.Close()
	p, err := tidemark.NewPipeline(tidemark.PipelineConfig{Source: bc.Name, MaxDelay: 20 * time.Millisecond}, tailer, nil, sink)
	if err != nil {
		e.t.Fatal(err)
	}
	target, err := harness.SourcePosition(e.my)
	if err != nil {
		e.t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx, e.start) }()
	for {
		_, last := p.Totals()
		if c, err := (tidemark.Position{GTID: last.GTID}).Compare(target); err == nil && c >= 0 {
			break
		}
		select {
		case err := <-done:
			stop()
			e.t.Fatalf("pipeline stopped: %v", err)
		case <-ctx.Done():
			stop()
			e.t.Fatalf("not caught up to %s", target)
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	// Run may report the cancellation when it lands during an apply (a
	// pipeline race, reported separately); everything needed is committed.
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		e.t.Fatal(err)
	}
}

// verify runs the engine on the real servers.
func (e *e2e) verify(vc VerifyConfig, tables []string, since time.Duration) *VerifyReport {
	e.t.Helper()
	ctx := context.Background()
	rep, err := runVerify(ctx, e.cfg, vc.withDefaults(), tables, since, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return rep
}

func tableOf(t *testing.T, rep *VerifyReport, name string) TableReport {
	t.Helper()
	for _, tr := range rep.Tables {
		if strings.HasSuffix(tr.Table, "."+name) {
			return tr
		}
	}
	t.Fatalf("no table %s in report", name)
	return TableReport{}
}

const ordersDDL = `CREATE TABLE orders (
	order_id BIGINT NOT NULL, line INT NOT NULL,
	customer VARCHAR(64) NOT NULL, amount DECIMAL(12,2) NOT NULL,
	status ENUM('new','paid','shipped') NOT NULL, tags SET('a','b','c'),
	note TEXT CHARACTER SET latin1, raw VARBINARY(16), flag BIT(3), yr YEAR, day DATE, dur TIME(6),
	f FLOAT, d DOUBLE, doc JSON, u BIGINT UNSIGNED,
	updated_at DATETIME(6) NOT NULL, paid_at TIMESTAMP(6) NULL,
	PRIMARY KEY (order_id, line)
) DEFAULT CHARSET=utf8mb4`

// fillOrders writes n orders of 2 lines in the source zone (IST), with
// every kind and the awkward values: the incident's 23:58 IST row, dates
// outside 1970–2038, non-ASCII latin1, JSON with unsorted keys and
// trailing zeros, floats that MariaDB prints with 6 digits.
func (e *e2e) fillOrders(n int) {
	e.t.Helper()
	e.my1("USE "+e.db, ordersDDL, "SET time_zone = '+00:00'")
	var vals []string
	for i := 0; i < n; i++ {
		for line := 1; line <= 2; line++ {
			day := time.Date(2026, 3, 1+i%20, 0, 0, 0, 0, time.UTC)
			upd := fmt.Sprintf("2026-03-%02d %02d:%02d:00.%06d", 1+i%20, (i*7+line)%24, i%60, i*1000%1000000)
			if i == 0 && line == 1 {
				upd = "2026-03-10 23:58:00" // the incident row: 18:28 UTC
			}
			if i == 1 {
				upd = "2040-06-01 12:00:00" // beyond CONVERT_TZ's range
			}
			if i == 2 {
				upd = "1960-05-01 00:00:00.5"
			}
			note := "'plain'"
			if i%3 == 0 {
				note = "'caf\u00e9 \u20ac5'"
			}
			if i%5 == 0 {
				note = "NULL"
			}
			vals = append(vals, fmt.Sprintf("(%d, %d, 'cust-%d ü', %d.%02d, '%s', '%s', %s, UNHEX('%02x00ff'), b'%03b', %d, '%s', '%s', %s, %s, %s, %d, '%s', %s)",
				i, line, i%17, i*3, (i*7)%100, []string{"new", "paid", "shipped"}[i%3], []string{"", "a", "a,c"}[i%3], note, i%256, i%8, 2000+i%50,
				day.Format("2006-01-02"), []string{"-01:00:00.5", "838:59:59", "00:00:00.000001"}[i%3],
				[]string{"3.14159274", "0.1", "16777216", "1.5e-7"}[i%4], []string{"1/3", "1e300", "0.1", "-2.5"}[i%4],
				[]string{`'{"b": 2.50, "a": [1, "x"]}'`, "'[]'", "NULL", `'{"z":{"y":1e2}}'`}[i%4], uint64(18446744073709551615)-uint64(i),
				upd, []string{"NULL", "'2026-03-10 18:28:00.25'"}[i%2]))
		}
	}
	for len(vals) > 0 {
		k := min(len(vals), 200)
		e.my1("INSERT INTO orders VALUES " + strings.Join(vals[:k], ","))
		vals = vals[k:]
	}
}

var ordersVerify = VerifyConfig{ChunkRows: 37, Examples: 5}

func (e *e2e) ordersConfig() VerifyConfig {
	vc := ordersVerify
	vc.Tables = map[string]VerifyTableConfig{e.db + ".orders": {EventTime: "updated_at", Sums: []string{"amount"}}}
	return vc
}

// TestVerifyFindsInjectedDifferences is the test: after a real
// replication verify says equal (so both databases compute the same
// canonical text for every kind); then it finds a missing row, an extra row,
// a changed value, a DATETIME shifted by 5h30 (the incident), a changed
// JSON document, and a duplicate key, and the daily totals that moved.
func TestVerifyFindsInjectedDifferences(t *testing.T) {
	e := newE2E(t)
	e.fillOrders(150)
	e.my1("CREATE TABLE names (name VARCHAR(20) NOT NULL PRIMARY KEY, n INT) DEFAULT CHARSET=utf8mb4 COLLATE utf8mb4_general_ci",
		"INSERT INTO names VALUES ('a',1),('B',2),('c',3),('é',4),('Z',5),('ab',6),('a b',7),('ø',8),('A1',9)")
	e.replicate()

	rep := e.verify(e.ordersConfig(), nil, 0)
	if rep.ExitCode() != exitVerifyEqual {
		var buf bytes.Buffer
		printVerify(&buf, rep)
		t.Fatalf("freshly replicated tables are not equal:\n%s", buf.String())
	}
	o := tableOf(t, rep, "orders")
	if o.SourceRows != 300 || o.TargetRows != 300 || o.Chunks != 9 || o.Days != 23 {
		t.Fatalf("orders: %+v", o)
	}
	nm := tableOf(t, rep, "names")
	if nm.SourceRows != 9 || nm.Verdict != verdictEqual {
		t.Fatalf("names: %+v", nm)
	}

	tbl := `"` + e.db + `".orders`
	e.pg1(
		"DELETE FROM "+tbl+" WHERE order_id = 5 AND line = 1", // missing
		"INSERT INTO "+tbl+" SELECT 9999, line, customer, amount, status, tags, note, raw, flag, yr, day, dur, f, d, doc, u, updated_at, paid_at, _tm_seq, _tm_idx FROM "+tbl+" WHERE order_id = 7 AND line = 2", // extra
		"UPDATE "+tbl+" SET amount = amount + 1 WHERE order_id = 7 AND line = 1",                                     // changed value
		"UPDATE "+tbl+" SET updated_at = updated_at + interval '5 hours 30 minutes' WHERE order_id = 0 AND line = 1", // the incident
		`UPDATE `+tbl+` SET doc = '{"a": [1, "x"], "b": 2.5}' WHERE order_id = 12 AND line = 1`,                      // same JSON, other text: equal
		`UPDATE `+tbl+` SET doc = '{"a": [1, "x"], "b": 2.51}' WHERE order_id = 16 AND line = 1`,                     // changed JSON
		"UPDATE "+tbl+" SET f = 3.1415925 WHERE order_id = 20 AND line = 2",                                          // changed float (7th digit)
		"ALTER TABLE "+tbl+" DROP CONSTRAINT orders_pkey",
		"INSERT INTO "+tbl+" SELECT * FROM "+tbl+" WHERE order_id = 10 AND line = 1", // duplicate key
		`UPDATE "`+e.db+`".names SET n = 40 WHERE name = 'é'`,
		`INSERT INTO "`+e.db+`".names (name, n, _tm_seq, _tm_idx) VALUES ('b', 1, 1, 1)`, // 'b' vs 'B': extra under byte order
	)
	rep = e.verify(e.ordersConfig(), nil, 0)
	if rep.ExitCode() != exitVerifyDifferent {
		t.Fatalf("exit code %d, want %d", rep.ExitCode(), exitVerifyDifferent)
	}
	o = tableOf(t, rep, "orders")
	var buf bytes.Buffer
	printVerify(&buf, rep)
	out := buf.String()
	t.Logf("report:\n%s", out)
	if o.Verdict != verdictDifferent || o.SourceRows != 300 || o.TargetRows != 301 || o.Missing != 1 || o.Extra != 1 || o.Changed != 4 || o.DuplicateKeys != 1 {
		t.Fatalf("orders: %+v", o)
	}
	if fmt.Sprint(o.MissingKeys) != "[[5 1]]" || fmt.Sprint(o.ExtraKeys) != "[[9999 2]]" || fmt.Sprint(o.Duplicates) != "[{[10 1] 2}]" {
		t.Fatalf("keys: missing %v, extra %v, duplicates %v", o.MissingKeys, o.ExtraKeys, o.Duplicates)
	}
	changed := map[string]string{}
	for _, c := range o.ChangedRows {
		var cols []string
		for _, d := range c.Columns {
			cols = append(cols, d.Column)
		}
		changed[strings.Join(c.Key, ",")] = strings.Join(cols, ",")
	}
	want := map[string]string{"0,1": "updated_at", "7,1": "amount", "16,1": "doc", "20,2": "f"}
	if fmt.Sprint(changed) != fmt.Sprint(want) {
		t.Fatalf("changed rows %v, want %v", changed, want)
	}
	for _, s := range []string{
		`updated_at: source "2026-03-10 23:58:00.000000 Asia/Kolkata = 2026-03-10T18:28:00Z", target "2026-03-11 05:28:00.000000 Asia/Kolkata = 2026-03-10T23:58:00Z"`,
		"missing in target: (5, 1)", "extra in target:   (9999, 2)", "duplicate key:     (10, 1) held by 2 rows", "verdict: DIFFERENT",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	// Daily totals per UTC day: (5,1) is gone from the 6th; the 7th
	// gained the extra row (a copy of (7,2)) and (7,1)'s extra 1.00; the
	// 11th holds the duplicate. The shifted row stays on its UTC day
	// (18:28Z → 23:58Z), so only the row-level check sees it.
	days := map[string]DayDiff{}
	for _, d := range o.DaysDiffering {
		days[d.Day] = d
	}
	if d := days["2026-03-06"]; len(days) != 3 || d.TargetCount != d.SourceCount-1 || fmt.Sprint(d.DifferingSum) != "[amount]" {
		t.Errorf("days differing: %+v", days)
	}
	if d := days["2026-03-07"]; d.TargetCount != d.SourceCount+1 {
		t.Errorf("2026-03-07: %+v", d)
	}
	if d := days["2026-03-11"]; d.TargetCount != d.SourceCount+1 {
		t.Errorf("2026-03-11: %+v", d)
	}
	nm = tableOf(t, rep, "names")
	if nm.Changed != 1 || nm.Extra != 1 || fmt.Sprint(nm.ExtraKeys) != "[[b]]" || nm.ChangedRows[0].Key[0] != "é" {
		t.Fatalf("names: %+v", nm)
	}

	// --json round-trips the same report.
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back VerifyReport
	if err := json.Unmarshal(js, &back); err != nil || back.Verdict != verdictDifferent || len(back.Tables) != 2 {
		t.Fatalf("json: %v %+v", err, back)
	}

	// One table only.
	rep = e.verify(e.ordersConfig(), []string{e.db + ".names"}, 0)
	if len(rep.Tables) != 1 || rep.Tables[0].Table != e.db+".names" {
		t.Fatalf("--table: %+v", rep.Tables)
	}
}

// TestVerifySince compares only the rows of the last hour (by the
// event-time column): a difference outside the window is not seen, one
// inside is.
func TestVerifySince(t *testing.T) {
	e := newE2E(t)
	e.my1("USE "+e.db, "CREATE TABLE ev (id INT PRIMARY KEY, amount DECIMAL(10,2), at DATETIME(6) NOT NULL)",
		"SET time_zone = 'Asia/Kolkata'",
		"INSERT INTO ev VALUES (1, 1.00, NOW(6) - INTERVAL 3 HOUR), (2, 2.00, NOW(6) - INTERVAL 10 MINUTE), (3, 3.00, NOW(6) - INTERVAL 5 MINUTE), (4, 4.00, NOW(6) - INTERVAL 2 DAY)")
	e.replicate()
	vc := VerifyConfig{Tables: map[string]VerifyTableConfig{e.db + ".ev": {EventTime: "at", Sums: []string{"amount"}}}}
	e.pg1(`UPDATE "` + e.db + `".ev SET amount = 9 WHERE id = 1`)
	rep := e.verify(vc, nil, time.Hour)
	ev := tableOf(t, rep, "ev")
	if ev.Verdict != verdictEqual || ev.SourceRows != 2 || ev.Since == nil || ev.Days != 1 {
		t.Fatalf("last hour: %+v", ev)
	}
	rep = e.verify(vc, nil, 4*time.Hour)
	ev = tableOf(t, rep, "ev")
	if ev.Verdict != verdictDifferent || ev.SourceRows != 3 || ev.Changed != 1 || len(ev.DaysDiffering) != 1 {
		t.Fatalf("last 4 hours: %+v", ev)
	}
	rep = e.verify(vc, nil, 0)
	if ev = tableOf(t, rep, "ev"); ev.SourceRows != 4 || ev.Days < 2 {
		t.Fatalf("whole table: %+v", ev)
	}
}

// TestCmdVerifyExitCodes runs the command as a user does: 0 equal, 1
// different, 2 error; a readable table or --json.
func TestCmdVerifyExitCodes(t *testing.T) {
	e := newE2E(t)
	e.my1("USE "+e.db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1,'a'),(2,'b'),(3,'c')")
	e.replicate()
	cfgPath := filepath.Join(t.TempDir(), "tidemark.yaml")
	yaml := fmt.Sprintf(`source:
  name: %s
  addr: %s
  user: %s
  password: ${TM_VERIFY_TEST_PW}
  server_id: %d
  time_zone: Asia/Kolkata
  include: [%s.*]
target:
  postgres:
    dsn: ${TM_VERIFY_TEST_DSN}
    control_schema: %s
log:
  level: error
`, e.cfg.Source.Name, e.env.MySQLAddr, e.env.MySQLUser, e.cfg.Source.ServerID, e.db, e.control)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TM_VERIFY_TEST_PW", e.env.MySQLPassword)
	t.Setenv("TM_VERIFY_TEST_DSN", e.env.PGDSN)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := cmdVerify(context.Background(), append([]string{"--config", cfgPath}, args...), &out, &errb, nil)
		return code, out.String(), errb.String()
	}
	if code, out, errs := run(); code != exitVerifyEqual || !strings.Contains(out, "verdict: EQUAL") {
		t.Fatalf("equal: exit %d\n%s\n%s", code, out, errs)
	}
	e.pg1(`DELETE FROM "` + e.db + `".t WHERE id = 2`)
	code, out, errs := run()
	if code != exitVerifyDifferent || !strings.Contains(out, "missing in target: (2)") {
		t.Fatalf("different: exit %d\n%s\n%s", code, out, errs)
	}
	code, out, _ = run("--json")
	var rep VerifyReport
	if code != exitVerifyDifferent || json.Unmarshal([]byte(out), &rep) != nil || rep.Tables[0].Missing != 1 {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	if code, out, errs = run("--table", e.db+".nope"); code != exitVerifyError || !strings.Contains(out, "not found") {
		t.Fatalf("missing table: exit %d\n%s\n%s", code, out, errs)
	}
	e.pg1(`DROP TABLE "` + e.db + `".t`)
	if code, out, errs = run(); code != exitVerifyError || !strings.Contains(out, "does not exist") {
		t.Fatalf("missing target table: exit %d\n%s\n%s", code, out, errs)
	}
	if code, _, _ = run("--since", "-1h"); code != exitVerifyError {
		t.Fatalf("bad flag: exit %d", code)
	}
}

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50, "a": [1, "x"]}`, `{"a":[1,"x"],"b":2.5}`},
		{`{"z":{"y":1e2}}`, `{"z": {"y": 100}}`},
		{`"é"`, `"\u00e9"`},
		{`[]`, `[ ]`},
	} {
		if x, y := canonicalJSON(tc.a), canonicalJSON(tc.b); x != y {
			t.Errorf("%s → %s, %s → %s", tc.a, x, tc.b, y)
		}
	}
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50}`, `{"b": 2.51}`},
		{`[1, 2]`, `[2, 1]`},
		{`{"a": null}`, `{}`},
		{`"1"`, `1`},
	} {
		if canonicalJSON(tc.a) == canonicalJSON(tc.b) {
			t.Errorf("%s and %s compare equal", tc.a, tc.b)
		}
	}
}

func TestGoCanonFloats(t *testing.T) {
	s := func(v string) *string { return &v }
	if goCanon(tidemark.KindFloat, s("3.1415927410125732")) != goCanon(tidemark.KindFloat, s("3.1415927")) {
		t.Error("float32 value printed as double and as float differ")
	}
	if goCanon(tidemark.KindFloat, s("3.1415925")) == goCanon(tidemark.KindFloat, s("3.1415927")) {
		t.Error("different float32 values compare equal")
	}
	if goCanon(tidemark.KindDouble, s("1e300")) != goCanon(tidemark.KindDouble, s("1e+300")) {
		t.Error("1e300 formats differ")
	}
	if goCanon(tidemark.KindDouble, nil) == goCanon(tidemark.KindDouble, s("0")) {
		t.Error("NULL equals 0")
	}
}

// TestAsserter: the post-load assertion stops (returns the violation) or
// alerts (logs and counts it), after a load and on its schedule.
func TestAsserter(t *testing.T) {
	e := newE2E(t)
	ctx := context.Background()
	store, err := checkpoint.New(checkpoint.Config{Schema: e.control})
	if err != nil {
		t.Fatal(err)
	}
	pc := e.cfg.PostgresSinkConfig()
	pc.TargetSchema, pc.Checkpoints, pc.Logger = e.db, store, slog.New(slog.DiscardHandler)
	sink, err := postgres.Open(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	tbl := &tidemark.Table{ID: tidemark.TableID{Database: "shop", Name: "a"}, Key: []int{0},
		Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt, Bits: 64}, {Name: "v", Kind: tidemark.KindInt, Bits: 64, Nullable: true}}}
	var changes []tidemark.Change
	for i := int64(1); i <= 3; i++ {
		changes = append(changes, tidemark.Change{Op: tidemark.OpInsert, Table: tbl, After: []any{i, i}, Version: tidemark.Version{Seq: 1, Index: uint32(i)}})
	}
	if _, err := sink.Apply(ctx, &tidemark.Batch{Source: "s", Changes: changes, Checkpoint: tidemark.Position{GTID: "0-1-1"}}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	stop := NewAsserter(sink, VerifyConfig{Assert: AssertConfig{Interval: 20 * time.Millisecond}}, log, nil)
	if err := stop.AfterLoad(ctx, time.Time{}); err != nil {
		t.Fatalf("clean: %v", err)
	}
	e.pg1(`ALTER TABLE "`+e.db+`".a DROP CONSTRAINT a_pkey`, `INSERT INTO "`+e.db+`".a SELECT * FROM "`+e.db+`".a WHERE id = 2`)
	err = stop.AfterLoad(ctx, time.Time{})
	if !errors.Is(err, tidemark.ErrDuplicateKeys) || !strings.Contains(err.Error(), e.db+".a") || !strings.Contains(err.Error(), "(2)×2") {
		t.Fatalf("stop: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := stop.Run(rctx); !errors.Is(err, tidemark.ErrDuplicateKeys) {
		t.Fatalf("scheduled run: %v, want the violation", err)
	}
	m := NewMetrics()
	alert := NewAsserter(sink, VerifyConfig{Assert: AssertConfig{OnViolation: assertAlert}}, log, m)
	if err := alert.AfterLoad(ctx, time.Time{}); err != nil {
		t.Fatalf("alert: %v", err)
	}
	if !strings.Contains(logs.String(), "post-load assertion failed") {
		t.Fatalf("alert not logged: %s", logs.String())
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `tidemark_errors_total{class="duplicate_keys"} 1`) {
		t.Fatalf("alert not counted:\n%s", grep(rec.Body.String(), "errors_total"))
	}
}

// TestJSONComparer: the fast comparison agrees with the exact canonical
// form, on spellings of one document and on documents that differ.
func TestJSONComparer(t *testing.T) {
	var c jsonComparer
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50, "a": [1, "x"]}`, `{"a":[1,"x"],"b":2.5}`},
		{`{"z":{"y":1e2, "x": 0.001}}`, `{"z": {"x": 1E-3, "y": 100}}`},
		{`{"k": 123, "tags": ["a", "b"]}`, `{"k":123,"tags":["a","b"]}`},
		{`"é"`, `"\u00e9"`},
		{`{"é": 1, "e": -0}`, `{"\u00e9": 1.0, "e": 0}`},
		{`[]`, `[ ]`},
		{`{}`, ` { } `},
		{`[-0.0, 0e5]`, `[0, 0]`},
		{`{"a": 1, "a": 2}`, `{"a": 2}`},
		{`12345678901234567890123`, `1.2345678901234567890123e22`},
	} {
		if !c.equal(tc.a, tc.b) || !c.equal(tc.b, tc.a) {
			t.Errorf("%s and %s compare different", tc.a, tc.b)
		}
	}
	for _, tc := range []struct{ a, b string }{
		{`{"b": 2.50}`, `{"b": 2.51}`},
		{`[1, 2]`, `[2, 1]`},
		{`{"a": null}`, `{}`},
		{`"1"`, `1`},
		{`{"a": {"b": 1}}`, `{"a": {"b": 1, "c": 1}}`},
		{`{"a": 1, "b": 2}`, `{"a": 2, "b": 1}`},
		{`[1.00000000000000001]`, `[1]`},
		{`{"a": "x\"y"}`, `{"a": "x\"z"}`},
		{`-1`, `1`},
		{`1e9`, `1e10`},
		{`{"a":`, `{"a": 1}`},
	} {
		if c.equal(tc.a, tc.b) || c.equal(tc.b, tc.a) {
			t.Errorf("%s and %s compare equal", tc.a, tc.b)
		}
	}
}

// FuzzJSONComparer: the fast path never calls two documents equal that the
// exact canonical form tells apart, and agrees with it otherwise.
func FuzzJSONComparer(f *testing.F) {
	f.Add(`{"b": 2.50, "a": [1, "x"]}`, `{"a":[1,"x"],"b":2.5}`)
	f.Add(`{"k": 1e2}`, `{"k": 100}`)
	f.Add(`[0.10, -3]`, `[1e-1, -3.0]`)
	f.Fuzz(func(t *testing.T, a, b string) {
		var c jsonComparer
		if got, want := c.equal(a, b), canonicalJSON(a) == canonicalJSON(b); got != want {
			t.Fatalf("equal(%q, %q) = %v, exact form says %v", a, b, got, want)
		}
	})
}
