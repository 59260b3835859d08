package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
	"tidemark/verify"
)

// e2e is one test's source database, target schema and control schema,
// replicated by a real tailer → sink pipeline, with the config a user
// would write for them.
type e2e struct {
	t       *testing.T
	r       *harness.Replica
	env     harness.Env
	my      *client.Conn
	pg      *pgx.Conn
	db      string // source database = target schema
	control string
	cfg     *Config
	start   tidemark.Position
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	r := harness.NewReplica(t, "vx")
	e := &e2e{t: t, r: r, env: r.Env, my: r.My, pg: r.PG, db: r.DB, control: r.Control, start: r.Start}
	e.cfg = &Config{
		Source: SourceConfig{Name: "vt" + e.db[3:9], Addr: e.env.MySQLAddr, User: e.env.MySQLUser, Password: e.env.MySQLPassword,
			ServerID: testenv.ServerID(), TimeZone: "Asia/Kolkata", Include: []string{e.db + ".*"}, StartPosition: e.start.String()},
		Target: TargetConfig{Postgres: &PostgresConfig{DSN: e.env.PGDSN, ControlSchema: e.control}},
	}
	if err := e.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return e
}

// daemon is the config a user would write for the e2e (the password and
// DSN as given, e.g. ${VAR}), target schema schema ("" = the default).
func (e *e2e) daemon(password, dsn, schema string) testenv.Daemon {
	return testenv.Daemon{
		Source: testenv.Source{Name: e.cfg.Source.Name, Addr: e.env.MySQLAddr, User: e.env.MySQLUser, Password: password,
			ServerID: e.cfg.Source.ServerID, TimeZone: "Asia/Kolkata", Include: []string{e.db + ".*"}},
		Target: testenv.Target{Postgres: &testenv.Postgres{DSN: dsn, Schema: schema, ControlSchema: e.control}},
		Log:    &testenv.Log{Level: "error"},
		// Metrics stays "off": the commands under test serve none.
	}
}

func (e *e2e) my1(sqls ...string) { e.t.Helper(); e.r.Source(sqls...) }

func (e *e2e) pg1(sqls ...string) { e.t.Helper(); e.r.Target(sqls...) }

// replicate runs the pipeline until it has committed everything the source
// has written so far, then stops it.
func (e *e2e) replicate() {
	e.t.Helper()
	bc, err := e.cfg.BinlogConfig()
	if err != nil {
		e.t.Fatal(err)
	}
	e.r.Replicate(bc, e.cfg.PostgresSinkConfig())
}

// TestCmdVerifyExitCodes runs the command as a user does: 0 equal, 1
// different, 2 error; a readable table or --json.
func TestCmdVerifyExitCodes(t *testing.T) {
	e := newE2E(t)
	e.my1("USE "+e.db, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1,'a'),(2,'b'),(3,'c')")
	e.replicate()
	cfgPath := e.daemon("${TM_VERIFY_TEST_PW}", "${TM_VERIFY_TEST_DSN}", "").Write(t)
	t.Setenv("TM_VERIFY_TEST_PW", e.env.MySQLPassword)
	t.Setenv("TM_VERIFY_TEST_DSN", e.env.PGDSN)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := cmdVerify(context.Background(), append([]string{"--config", cfgPath}, args...), &out, &errb, nil)
		return code, out.String(), errb.String()
	}
	if code, out, errs := run(); code != verify.ExitEqual || !strings.Contains(out, "verdict: EQUAL") {
		t.Fatalf("equal: exit %d\n%s\n%s", code, out, errs)
	}
	e.pg1(`DELETE FROM "` + e.db + `".t WHERE id = 2`)
	code, out, errs := run()
	if code != verify.ExitDifferent || !strings.Contains(out, "missing in target: (2)") {
		t.Fatalf("different: exit %d\n%s\n%s", code, out, errs)
	}
	code, out, _ = run("--json")
	var rep verify.Report
	if code != verify.ExitDifferent || json.Unmarshal([]byte(out), &rep) != nil || rep.Tables[0].Missing != 1 {
		t.Fatalf("--json: exit %d\n%s", code, out)
	}
	if code, out, errs = run("--table", e.db+".nope"); code != verify.ExitError || !strings.Contains(out, "not found") {
		t.Fatalf("missing table: exit %d\n%s\n%s", code, out, errs)
	}
	e.pg1(`DROP TABLE "` + e.db + `".t`)
	if code, out, errs = run(); code != verify.ExitError || !strings.Contains(out, "does not exist") {
		t.Fatalf("missing target table: exit %d\n%s\n%s", code, out, errs)
	}
	if code, _, _ = run("--since", "-1h"); code != verify.ExitError {
		t.Fatalf("bad flag: exit %d", code)
	}
}

// TestPrintVerify: the readable report lists what differs, with the instant
// a DATETIME means, and the verdict.
func TestPrintVerify(t *testing.T) {
	s := func(v string) *string { return &v }
	rep := &verify.Report{Source: "s", Verdict: verify.VerdictDifferent, Tables: []verify.TableReport{
		{Table: "shop.t", Target: "shop.t", Verdict: verify.VerdictEqual, SourceRows: 3, TargetRows: 3, Chunks: 1},
		{Table: "shop.orders", Target: "shop.orders", Verdict: verify.VerdictDifferent, SourceRows: 300, TargetRows: 301, Chunks: 9, ChunksDiffering: 3,
			Missing: 1, Extra: 1, Changed: 2, MissingKeys: [][]string{{"5", "1"}}, ExtraKeys: [][]string{{"9999", "2"}},
			ChangedRows: []verify.ChangedRow{{Key: []string{"0", "1"}, Columns: []verify.ColumnDiff{{Column: "updated_at",
				Source: s("2026-03-10 23:58:00.000000 Asia/Kolkata = 2026-03-10T18:28:00Z"), Target: s("2026-03-11 05:28:00.000000 Asia/Kolkata = 2026-03-10T23:58:00Z")}}}},
			DuplicateKeys: 1, Duplicates: []tidemark.DuplicateKey{{Key: []string{"10", "1"}, Rows: 2}},
			Sums: []string{"amount"}, Days: 23, DaysDiffering: []verify.DayDiff{{Day: "2026-03-06", SourceCount: 14, TargetCount: 13, SourceSums: []string{"10.00"}, TargetSums: []string{""}, DifferingSum: []string{"amount"}}}},
	}}
	var buf bytes.Buffer
	printVerify(&buf, rep)
	out := buf.String()
	for _, s := range []string{
		`updated_at: source "2026-03-10 23:58:00.000000 Asia/Kolkata = 2026-03-10T18:28:00Z", target "2026-03-11 05:28:00.000000 Asia/Kolkata = 2026-03-10T23:58:00Z"`,
		"missing in target: (5, 1)", "extra in target:   (9999, 2)", "… and 1 more changed", "duplicate key:     (10, 1) held by 2 rows",
		"day 2026-03-06 (UTC): count source 14, target 13; SUM(amount) source 10.00, target NULL", "row count: source 300, target 301", "verdict: DIFFERENT",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("report lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "shop.t → shop.t") {
		t.Errorf("an equal table is detailed:\n%s", out)
	}
}
