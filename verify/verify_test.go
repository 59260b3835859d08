package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
	"tidemark/sink/postgres"
)

// e2e is one test's source database, target schema and control schema,
// replicated by a real tailer → sink pipeline, with the source written in
// Asia/Kolkata.
type e2e struct {
	*harness.Replica
	bc binlog.Config
	pc postgres.Config
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	r := harness.NewReplica(t, "vx")
	loc, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	bc := binlog.Config{Name: "vt" + r.DB[3:9], Addr: r.Env.MySQLAddr, User: r.Env.MySQLUser, Password: r.Env.MySQLPassword,
		ServerID: testenv.ServerID(), Zone: tidemark.ZonePolicy{Location: loc}, Include: []string{r.DB + ".*"}}
	if err := bc.Validate(); err != nil {
		t.Fatal(err)
	}
	return &e2e{Replica: r, bc: bc, pc: postgres.Config{DSN: r.Env.PGDSN}}
}

func (e *e2e) replicate() {
	e.T.Helper()
	e.Replicate(e.bc, e.pc)
}

// verify runs the engine on the real servers over tables ("db.table"; all
// when empty).
func (e *e2e) verify(vc Config, tables []string, since time.Duration) *Report {
	e.T.Helper()
	ctx := context.Background()
	src, err := binlog.NewVerifier(e.bc)
	if err != nil {
		e.T.Fatal(err)
	}
	defer src.Close()
	store, err := checkpoint.New(checkpoint.Config{Schema: e.Control})
	if err != nil {
		e.T.Fatal(err)
	}
	pc := e.pc
	pc.Checkpoints, pc.Logger = store, slog.New(slog.DiscardHandler)
	sink, err := postgres.Open(ctx, pc)
	if err != nil {
		e.T.Fatal(err)
	}
	defer sink.Close()
	opt := Options{Source: e.bc.Name, Config: vc, Since: since,
		Zone: func(tidemark.TableID, string) string { return e.bc.Zone.Location.String() }}
	for _, s := range tables {
		db, name, _ := strings.Cut(s, ".")
		opt.Tables = append(opt.Tables, tidemark.TableID{Database: db, Name: name})
	}
	rep, err := Tables(ctx, src, postgres.NewVerifier(sink), opt)
	if err != nil {
		e.T.Fatal(err)
	}
	return rep
}

// dump formats a report for a failure message.
func dump(rep *Report) string {
	b, _ := json.MarshalIndent(rep, "", "  ")
	return string(b)
}

func fmtVal(v *string) string {
	if v == nil {
		return "NULL"
	}
	return strconv.Quote(*v)
}

func tableOf(t *testing.T, rep *Report, name string) TableReport {
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
	e.T.Helper()
	e.Source("USE "+e.DB, ordersDDL, "SET time_zone = '+00:00'")
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
		e.Source("INSERT INTO orders VALUES " + strings.Join(vals[:k], ","))
		vals = vals[k:]
	}
}

var ordersVerify = Config{ChunkRows: 37, Examples: 5}

func (e *e2e) ordersConfig() Config {
	vc := ordersVerify
	vc.Tables = map[string]TableConfig{e.DB + ".orders": {EventTime: "updated_at", Sums: []string{"amount"}}}
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
	e.Source("CREATE TABLE names (name VARCHAR(20) NOT NULL PRIMARY KEY, n INT) DEFAULT CHARSET=utf8mb4 COLLATE utf8mb4_general_ci",
		"INSERT INTO names VALUES ('a',1),('B',2),('c',3),('é',4),('Z',5),('ab',6),('a b',7),('ø',8),('A1',9)")
	e.replicate()

	rep := e.verify(e.ordersConfig(), nil, 0)
	if rep.ExitCode() != ExitEqual {
		t.Fatalf("freshly replicated tables are not equal:\n%s", dump(rep))
	}
	o := tableOf(t, rep, "orders")
	if o.SourceRows != 300 || o.TargetRows != 300 || o.Chunks != 9 || o.Days != 23 {
		t.Fatalf("orders: %+v", o)
	}
	nm := tableOf(t, rep, "names")
	if nm.SourceRows != 9 || nm.Verdict != VerdictEqual {
		t.Fatalf("names: %+v", nm)
	}

	tbl := `"` + e.DB + `".orders`
	e.Target(
		"DELETE FROM "+tbl+" WHERE order_id = 5 AND line = 1", // missing
		"INSERT INTO "+tbl+" SELECT 9999, line, customer, amount, status, tags, note, raw, flag, yr, day, dur, f, d, doc, u, updated_at, paid_at, _tm_seq, _tm_idx FROM "+tbl+" WHERE order_id = 7 AND line = 2", // extra
		"UPDATE "+tbl+" SET amount = amount + 1 WHERE order_id = 7 AND line = 1",                                     // changed value
		"UPDATE "+tbl+" SET updated_at = updated_at + interval '5 hours 30 minutes' WHERE order_id = 0 AND line = 1", // the incident
		`UPDATE `+tbl+` SET doc = '{"a": [1, "x"], "b": 2.5}' WHERE order_id = 12 AND line = 1`,                      // same JSON, other text: equal
		`UPDATE `+tbl+` SET doc = '{"a": [1, "x"], "b": 2.51}' WHERE order_id = 16 AND line = 1`,                     // changed JSON
		"UPDATE "+tbl+" SET f = 3.1415925 WHERE order_id = 20 AND line = 2",                                          // changed float (7th digit)
		"ALTER TABLE "+tbl+" DROP CONSTRAINT orders_pkey",
		"INSERT INTO "+tbl+" SELECT * FROM "+tbl+" WHERE order_id = 10 AND line = 1", // duplicate key
		`UPDATE "`+e.DB+`".names SET n = 40 WHERE name = 'é'`,
		`INSERT INTO "`+e.DB+`".names (name, n, _tm_seq, _tm_idx) VALUES ('b', 1, 1, 1)`, // 'b' vs 'B': extra under byte order
	)
	rep = e.verify(e.ordersConfig(), nil, 0)
	if rep.ExitCode() != ExitDifferent {
		t.Fatalf("exit code %d, want %d", rep.ExitCode(), ExitDifferent)
	}
	o = tableOf(t, rep, "orders")
	t.Logf("report:\n%s", dump(rep))
	if o.Verdict != VerdictDifferent || o.SourceRows != 300 || o.TargetRows != 301 || o.Missing != 1 || o.Extra != 1 || o.Changed != 4 || o.DuplicateKeys != 1 {
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
	// A DATETIME that differs is shown with the instant it means.
	for _, c := range o.ChangedRows {
		if strings.Join(c.Key, ",") != "0,1" {
			continue
		}
		d := c.Columns[0]
		if got := fmtVal(d.Source) + ", " + fmtVal(d.Target); got != `"2026-03-10 23:58:00.000000 Asia/Kolkata = 2026-03-10T18:28:00Z", "2026-03-11 05:28:00.000000 Asia/Kolkata = 2026-03-10T23:58:00Z"` {
			t.Errorf("updated_at of (0, 1): %s", got)
		}
	}
	if rep.Verdict != VerdictDifferent {
		t.Errorf("verdict %s, want %s", rep.Verdict, VerdictDifferent)
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
	var back Report
	if err := json.Unmarshal(js, &back); err != nil || back.Verdict != VerdictDifferent || len(back.Tables) != 2 {
		t.Fatalf("json: %v %+v", err, back)
	}

	// One table only.
	rep = e.verify(e.ordersConfig(), []string{e.DB + ".names"}, 0)
	if len(rep.Tables) != 1 || rep.Tables[0].Table != e.DB+".names" {
		t.Fatalf("--table: %+v", rep.Tables)
	}
}

// TestVerifySince compares only the rows of the last hour (by the
// event-time column): a difference outside the window is not seen, one
// inside is.
func TestVerifySince(t *testing.T) {
	e := newE2E(t)
	e.Source("USE "+e.DB, "CREATE TABLE ev (id INT PRIMARY KEY, amount DECIMAL(10,2), at DATETIME(6) NOT NULL)",
		"SET time_zone = 'Asia/Kolkata'",
		"INSERT INTO ev VALUES (1, 1.00, NOW(6) - INTERVAL 3 HOUR), (2, 2.00, NOW(6) - INTERVAL 10 MINUTE), (3, 3.00, NOW(6) - INTERVAL 5 MINUTE), (4, 4.00, NOW(6) - INTERVAL 2 DAY)")
	e.replicate()
	vc := Config{Tables: map[string]TableConfig{e.DB + ".ev": {EventTime: "at", Sums: []string{"amount"}}}}
	e.Target(`UPDATE "` + e.DB + `".ev SET amount = 9 WHERE id = 1`)
	rep := e.verify(vc, nil, time.Hour)
	ev := tableOf(t, rep, "ev")
	if ev.Verdict != VerdictEqual || ev.SourceRows != 2 || ev.Since == nil || ev.Days != 1 {
		t.Fatalf("last hour: %+v", ev)
	}
	rep = e.verify(vc, nil, 4*time.Hour)
	ev = tableOf(t, rep, "ev")
	if ev.Verdict != VerdictDifferent || ev.SourceRows != 3 || ev.Changed != 1 || len(ev.DaysDiffering) != 1 {
		t.Fatalf("last 4 hours: %+v", ev)
	}
	rep = e.verify(vc, nil, 0)
	if ev = tableOf(t, rep, "ev"); ev.SourceRows != 4 || ev.Days < 2 {
		t.Fatalf("whole table: %+v", ev)
	}
}

// TestAsserter: the post-load assertion stops (returns the violation) or
// alerts (logs and counts it), after a load and on its schedule.
func TestAsserter(t *testing.T) {
	e := newE2E(t)
	ctx := context.Background()
	store, err := checkpoint.New(checkpoint.Config{Schema: e.Control})
	if err != nil {
		t.Fatal(err)
	}
	pc := e.pc
	pc.TargetSchema, pc.Checkpoints, pc.Logger = e.DB, store, slog.New(slog.DiscardHandler)
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
	stop := NewAsserter(sink, AssertConfig{Interval: 20 * time.Millisecond}, log, nil)
	if err := stop.AfterLoad(ctx, time.Time{}); err != nil {
		t.Fatalf("clean: %v", err)
	}
	e.Target(`ALTER TABLE "`+e.DB+`".a DROP CONSTRAINT a_pkey`, `INSERT INTO "`+e.DB+`".a SELECT * FROM "`+e.DB+`".a WHERE id = 2`)
	err = stop.AfterLoad(ctx, time.Time{})
	if !errors.Is(err, tidemark.ErrDuplicateKeys) || !strings.Contains(err.Error(), e.DB+".a") || !strings.Contains(err.Error(), "(2)×2") {
		t.Fatalf("stop: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := stop.Run(rctx); !errors.Is(err, tidemark.ErrDuplicateKeys) {
		t.Fatalf("scheduled run: %v, want the violation", err)
	}
	var counted []error
	alert := NewAsserter(sink, AssertConfig{OnViolation: AssertAlert}, log, func(err error) { counted = append(counted, err) })
	if err := alert.AfterLoad(ctx, time.Time{}); err != nil {
		t.Fatalf("alert: %v", err)
	}
	if !strings.Contains(logs.String(), "post-load assertion failed") {
		t.Fatalf("alert not logged: %s", logs.String())
	}
	if len(counted) != 1 || !errors.Is(counted[0], tidemark.ErrDuplicateKeys) {
		t.Fatalf("alert counted %v, want the one violation", counted)
	}
}

// TestVerifyTextKeysByteOrder: verify's chunks and row hashes do not have
// the key diff's flaws: keys that a PAD SPACE collation orders differently
// from PostgreSQL's "C" verify equal in chunks of one row, and ('a', 'b|c')
// is told apart from ('a|b', 'c').
func TestVerifyTextKeysByteOrder(t *testing.T) {
	e := newE2E(t)
	e.Source("USE "+e.DB, "CREATE TABLE k (k VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, v INT)",
		"INSERT INTO k VALUES ('a\\t', 1), ('a', 2), ('a\\n', 3), ('a\\tb', 4), ('b', 5), ('B', 6), ('é', 7), ('a\\t\\t', 8)",
		"CREATE TABLE c (k1 VARCHAR(20) NOT NULL, k2 VARCHAR(20) NOT NULL, v INT, PRIMARY KEY (k1, k2))",
		"INSERT INTO c VALUES ('a|b', 'c', 1), ('z', 'z', 2)")
	e.replicate()
	for _, chunk := range []int{1, 2, 3} {
		if rep := e.verify(Config{ChunkRows: chunk, Examples: 5}, nil, 0); rep.ExitCode() != ExitEqual {
			t.Fatalf("chunk %d: equal tables verify as different:\n%s", chunk, dump(rep))
		}
	}
	e.Target(`UPDATE "` + e.DB + `".c SET k1 = 'a', k2 = 'b|c' WHERE k1 = 'a|b'`)
	if rep := e.verify(Config{ChunkRows: 1, Examples: 5}, nil, 0); rep.ExitCode() != ExitDifferent {
		t.Fatalf("('a', 'b|c') in the target for ('a|b', 'c') in the source: exit %d, want %d", rep.ExitCode(), ExitDifferent)
	}
}
