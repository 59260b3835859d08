package binlog

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

// collectUntil streams until done says the chunks so far are complete.
// Other writers may share the server: their transactions arrive as chunks
// without changes (the include filter), so tests wait for what they expect
// rather than count commits.
func collectUntil(t *testing.T, tl *Tailer, from tidemark.Position, done func([]tidemark.Chunk) bool) []tidemark.Chunk {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make(chan tidemark.Chunk, 4)
	errc := make(chan error, 1)
	go func() { errc <- tl.Stream(ctx, from, out) }()
	var chunks []tidemark.Chunk
	for !done(chunks) {
		select {
		case ch := <-out:
			if len(ch.Changes) > 0 || len(ch.DDL) > 0 {
				chunks = append(chunks, ch)
			}
		case err := <-errc:
			t.Fatalf("stream ended early: %v", err)
		case <-ctx.Done():
			t.Fatalf("timed out with %d chunks", len(chunks))
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("stream: %v", err)
	}
	return chunks
}

// counted returns a done func: at least changes changes and ddl DDL events.
func counted(changes, ddl int) func([]tidemark.Chunk) bool {
	return func(chunks []tidemark.Chunk) bool {
		c, d := 0, 0
		for _, ch := range chunks {
			c += len(ch.Changes)
			d += len(ch.DDL)
		}
		return c >= changes && d >= ddl
	}
}

func columnNames(t *tidemark.Table) string {
	var out []string
	for _, c := range t.Columns {
		out = append(out, c.Name)
	}
	return strings.Join(out, ",")
}

// TestTailerBacklogAcrossAlter writes rows, alters the table (add, reorder,
// drop, rename), writes more, and only then reads the binlog: every row is
// decoded with the columns it was written with, and the ALTERs arrive as
// DDL events in order.
func TestTailerBacklogAcrossAlter(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bs_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE t (id INT PRIMARY KEY, a INT, b VARCHAR(10))")
	from := currentGTID(t, c)
	exec(t, c,
		"INSERT INTO t VALUES (1, 10, 'one')",
		"ALTER TABLE t ADD COLUMN c INT",
		"INSERT INTO t VALUES (2, 20, 'two', 200)",
		"ALTER TABLE t MODIFY b VARCHAR(10) FIRST, DROP COLUMN a",
		"INSERT INTO t (id, b, c) VALUES (3, 'three', 300)",
		"ALTER TABLE t RENAME COLUMN c TO cc",
		"UPDATE t SET cc = 301 WHERE id = 3",
		"TRUNCATE TABLE t",
		"DROP TABLE t")
	chunks := collectUntil(t, newTailer(t, addr, user, pass, db, "UTC"), from, counted(4, 5))
	type row struct {
		cols string
		vals []any
	}
	var rows []row
	var ddl []tidemark.DDLEvent
	for _, ch := range chunks {
		ddl = append(ddl, ch.DDL...)
		if len(ch.DDL) > 0 && len(ch.Changes) > 0 {
			t.Fatalf("a standalone DDL statement shares a chunk with rows: %+v", ch)
		}
		for _, c := range ch.Changes {
			rows = append(rows, row{columnNames(c.Table), c.Row()})
		}
	}
	want := []row{
		{"id,a,b", []any{int64(1), int64(10), "one"}},
		{"id,a,b,c", []any{int64(2), int64(20), "two", int64(200)}},
		{"b,id,c", []any{"three", int64(3), int64(300)}},
		{"b,id,cc", []any{"three", int64(3), int64(301)}},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(rows), len(want), rows)
	}
	for i := range want {
		if rows[i].cols != want[i].cols {
			t.Errorf("row %d decoded with columns %s, want %s", i, rows[i].cols, want[i].cols)
		}
		for j := range want[i].vals {
			if rows[i].vals[j] != want[i].vals[j] {
				t.Errorf("row %d value %d = %#v, want %#v", i, j, rows[i].vals[j], want[i].vals[j])
			}
		}
	}
	var ops []string
	for _, ev := range ddl {
		if ev.Table.Database != db || ev.Table.Name != "t" || ev.Version.Seq == 0 {
			t.Errorf("event %+v", ev)
		}
		ops = append(ops, ev.Op.String())
	}
	if got := strings.Join(ops, "|"); got != "ALTER TABLE|ALTER TABLE|ALTER TABLE|TRUNCATE|DROP TABLE" {
		t.Fatalf("DDL events %s", got)
	}
	if ddl[0].Added[0] != "c" || ddl[0].Backfill || ddl[1].Dropped[0] != "a" || ddl[2].Renames[0] != (tidemark.ColumnRename{From: "c", To: "cc"}) {
		t.Fatalf("ALTER details %+v", ddl[:3])
	}
	for i := 1; i < len(ddl); i++ {
		if ddl[i].Version.Compare(ddl[i-1].Version) <= 0 {
			t.Fatalf("DDL versions not increasing: %v then %v", ddl[i-1].Version, ddl[i].Version)
		}
	}
}

// TestTailerCreateSelectAndUndecodable: CREATE TABLE … SELECT logs its
// CREATE inside the transaction with the rows; a table without a primary
// key is reported once as undecodable instead of stopping the stream.
func TestTailerCreateSelectAndUndecodable(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bs_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db)
	from := currentGTID(t, c)
	exec(t, c,
		"CREATE TABLE cs (id INT PRIMARY KEY) SELECT 1 AS id UNION SELECT 2",
		"CREATE TABLE nokey (a INT)",
		"INSERT INTO nokey VALUES (1), (2)",
		"INSERT INTO nokey VALUES (3)",
		"CREATE TABLE ok (id INT PRIMARY KEY)",
		"INSERT INTO ok VALUES (1)")
	chunks := collectUntil(t, newTailer(t, addr, user, pass, db, "UTC"), from, counted(3, 4))
	var undecodable, creates int
	okRows := 0
	for _, ch := range chunks {
		for _, ev := range ch.DDL {
			switch ev.Op {
			case tidemark.DDLUndecodable:
				undecodable++
				if ev.Table.Name != "nokey" || !strings.Contains(ev.Reason, "no primary key") {
					t.Errorf("undecodable event %+v", ev)
				}
			case tidemark.DDLCreateTable:
				creates++
				if ev.Table.Name == "cs" && len(ch.Changes) != 2 {
					t.Errorf("CREATE … SELECT: the create should come with its 2 rows, got %d", len(ch.Changes))
				}
			}
		}
		for _, c := range ch.Changes {
			if c.Table.ID.Name == "nokey" {
				t.Fatal("a row of the undecodable table was emitted")
			}
			if c.Table.ID.Name == "ok" {
				okRows++
			}
		}
	}
	if undecodable != 1 || creates != 3 || okRows != 1 {
		t.Fatalf("undecodable %d (want 1), creates %d (want 3), rows of ok %d (want 1)", undecodable, creates, okRows)
	}
}

// TestColumnExclusion: excluded columns are gone from the tailer's and the
// reader's schemas and rows alike; a key column cannot be excluded.
func TestColumnExclusion(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bs_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db,
		"CREATE TABLE users (ssn VARCHAR(11), id INT PRIMARY KEY, name VARCHAR(20), Email VARCHAR(50))",
		"CREATE TABLE keyed (id INT PRIMARY KEY, v INT)")
	from := currentGTID(t, c)
	exec(t, c, "INSERT INTO users VALUES ('123-45-6789', 1, 'ann', 'ann@example.com')",
		"UPDATE users SET ssn = '999-99-9999', name = 'anne' WHERE id = 1",
		"INSERT INTO keyed VALUES (1, 1)")
	cfg := Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: testenv.ServerID(),
		Include: []string{db + ".*"}, Heartbeat: time.Second,
		ExcludeColumns: map[string][]string{db + ".users": {"ssn", "email"}, "*.keyed": {"id"}}}
	tl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	chunks := collectUntil(t, tl, from, counted(2, 1))
	var got []tidemark.Change
	var undecodable []tidemark.DDLEvent
	for _, ch := range chunks {
		got = append(got, ch.Changes...)
		undecodable = append(undecodable, ch.DDL...)
	}
	if len(got) != 2 {
		t.Fatalf("%d changes, want the 2 of users", len(got))
	}
	for _, ch := range got {
		if cols := columnNames(ch.Table); cols != "id,name" || ch.Table.KeyNames()[0] != "id" {
			t.Fatalf("columns %s key %v", cols, ch.Table.KeyNames())
		}
		for _, img := range [][]any{ch.Before, ch.After} {
			for _, v := range img {
				if s, ok := v.(string); ok && (strings.Contains(s, "-") || strings.Contains(s, "@")) {
					t.Fatalf("an excluded value left the tailer: %q", s)
				}
			}
		}
	}
	if len(undecodable) != 1 || undecodable[0].Op != tidemark.DDLUndecodable || !strings.Contains(undecodable[0].Reason, "key column") {
		t.Fatalf("excluding a key column: %+v", undecodable)
	}

	r, err := NewReader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	res, err := r.Read(ctx, tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: "users"}, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 1 || res.Changes[0].Table.Fingerprint() != got[1].Table.Fingerprint() || res.Changes[0].After[1] != "anne" {
		t.Fatalf("reader: %+v (fingerprint %s vs %s)", res.Changes, res.Changes[0].Table.Fingerprint(), got[1].Table.Fingerprint())
	}
	if _, err := r.Table(ctx, tidemark.TableID{Database: db, Name: "keyed"}); err == nil || !strings.Contains(err.Error(), "key column") {
		t.Fatalf("reader with an excluded key column: %v", err)
	}

	for _, bad := range []Config{
		{ExcludeColumns: map[string][]string{"nodot": {"a"}}},
		{ExcludeColumns: map[string][]string{"d.t": {`a"b`}}},
		{ExcludeColumns: map[string][]string{"d.*": {"k"}}, BusinessKeys: map[string][]string{"d.t": {"k"}}},
	} {
		bad.Name, bad.Addr, bad.User, bad.ServerID = "x", "h:1", "u", 1
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "exclude_columns") {
			t.Errorf("Validate(%v) = %v", bad.ExcludeColumns, err)
		}
	}
}

// TestReaderMatchesBinlogSchemaEdges extends the reader/binlog agreement to
// generated columns (MariaDB logs VIRTUAL and STORED values in a FULL row
// image, and information_schema lists them: both sides carry them), keyword
// column names and a latin1 table (the binlog's latin1 bytes decoded as
// cp1252, the reader's UTF-8 from the server).
func TestReaderMatchesBinlogSchemaEdges(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bs_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db,
		"CREATE TABLE g (id INT PRIMARY KEY, a INT, v INT AS (a * 2) VIRTUAL, s VARCHAR(20) AS (CONCAT('x', a)) STORED, `order` INT, `select` VARCHAR(5))",
		"CREATE TABLE `from` (`key` VARCHAR(10) PRIMARY KEY, txt VARCHAR(40), ch CHAR(3)) DEFAULT CHARSET=latin1")
	from := currentGTID(t, c)
	exec(t, c, "SET NAMES utf8mb4",
		"INSERT INTO g (id, a, `order`, `select`) VALUES (1, 21, 7, 'x'), (2, NULL, NULL, NULL)",
		"INSERT INTO `from` VALUES ('ü1', 'café € ‰ œ Ÿ', 'ÿé'), ('k2', NULL, '')")
	chunks := collectUntil(t, newTailer(t, addr, user, pass, db, "UTC"), from, counted(4, 0))
	var bin []tidemark.Change
	for _, ch := range chunks {
		bin = append(bin, ch.Changes...)
	}
	if len(bin) != 4 {
		t.Fatalf("%d changes", len(bin))
	}
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Include: []string{db + ".*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	var read []tidemark.Change
	for _, name := range []string{"g", "from"} {
		res, err := r.Read(ctx, tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: name}, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		read = append(read, res.Changes...)
		// The keyset cursor over a keyword key column.
		res, err = r.Read(ctx, tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: name}, Limit: 1, After: res.Next})
		if err != nil {
			t.Fatal(err)
		}
		read = append(read, res.Changes...)
	}
	// Reader order is key order: g 1, 2; from 'k2' < 'ü1'.
	read[2], read[3] = read[3], read[2]
	for i := range bin {
		if read[i].Table.Fingerprint() != bin[i].Table.Fingerprint() {
			t.Fatalf("%s: schemas differ:\nreader %s\nbinlog %s", bin[i].Table.ID, read[i].Table.Fingerprint(), bin[i].Table.Fingerprint())
		}
		for j, col := range bin[i].Table.Columns {
			if !sameValue(read[i].After[j], bin[i].After[j]) {
				t.Errorf("%s row %d column %s: reader %#v, binlog %#v", bin[i].Table.ID.Name, i, col.Name, read[i].After[j], bin[i].After[j])
			}
		}
	}
	g := bin[0]
	if g.After[g.Table.ColumnIndex("v")] != int64(42) || g.After[g.Table.ColumnIndex("s")] != "x21" {
		t.Errorf("generated columns: %v", g.After)
	}
	if l := bin[2]; l.After[1] != "café € ‰ œ Ÿ" || l.After[2] != "ÿé" {
		t.Errorf("latin1 via the binlog: %q", l.After)
	}
}

func TestUndecodableIsNotTransient(t *testing.T) {
	// A per-table decode error must not look transient (it would be
	// retried forever) nor be returned at all: the tailer reports it.
	err := errors.New("decode table map of d.t: table has no primary key")
	if isTransient(err) {
		t.Fatal("decode error classified transient")
	}
}
