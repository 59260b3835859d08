package binlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"tidemark"
	"tidemark/internal/testenv"
)

const typesDDL = `CREATE TABLE t (
		id INT NOT NULL, region VARCHAR(10) NOT NULL,
		ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
		ii INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
		d DECIMAL(30,10), f FLOAT, dbl DOUBLE, c CHAR(5), vc VARCHAR(100), tx TEXT, bl BLOB,
		bn BINARY(4), vb VARBINARY(10), e ENUM('new','paid','shipped'), st SET('a','b','c'),
		bt BIT(10), y YEAR, dt DATE, tm TIME(6), dtm DATETIME(6), ts TIMESTAMP(6) NULL, j JSON,
		l1 VARCHAR(20) CHARACTER SET latin1,
		PRIMARY KEY (id, region)) DEFAULT CHARSET=utf8mb4`

func sameValue(a, b any) bool {
	switch x := a.(type) {
	case []byte:
		y, ok := b.([]byte)
		return ok && bytes.Equal(x, y)
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y) && x.Location() == y.Location()
	}
	return a == b
}

// TestReaderMatchesBinlog reads the same rows through the binlog and through
// SQL and requires identical schemas and values: a catch-up row and a binlog
// row of the same state must be the same row.
func TestReaderMatchesBinlog(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("br_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, typesDDL)
	from := currentGTID(t, c)
	exec(t, c, "SET time_zone = '+00:00'",
		`INSERT INTO t VALUES (1, 'eu', -128, 255, -32768, -8388608, 16777215, -2147483648, 4294967295,
			-9223372036854775808, 18446744073709551615, '-12345678901234567890.0123456789', 0.1, 0.1,
			'ab', 'héllo 🐳', 'long text', X'00FF10', X'01020304', X'0001', 'paid', 'a,c', b'1010101010', 2026,
			'2026-03-10', '-838:59:59.000000', '2026-03-10 23:58:00.123456', '2026-03-10 12:00:00.5', '{"a": [1, 2, {"b": null}]}', 'café €')`,
		`INSERT INTO t (id, region) VALUES (2, 'us')`,
		`INSERT INTO t (id, region, f, dtm, ts, dt) VALUES (3, 'eu', 3.40282e38, '1000-01-01 00:00:00', '1970-01-01 00:00:01', '1000-01-01')`,
		`INSERT INTO t (id, region, f, dtm, ts) VALUES (4, 'eu', 1.17549435e-38, '9999-12-31 23:59:59.999999', '2038-01-19 03:14:07')`)
	changes, _ := collect(t, newTailer(t, addr, user, pass, db, "Asia/Kolkata"), from, 4)

	loc, _ := time.LoadLocation("Asia/Kolkata")
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Include: []string{db + ".*"}, Zone: tidemark.ZonePolicy{Location: loc}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	snap, err := r.Capture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Version.Seq == 0 || snap.Position.GTID == "" || snap.Position.File == "" {
		t.Fatalf("capture: %+v", snap)
	}
	res, err := r.Read(ctx, tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: "t"}, Limit: 100, Snapshot: snap})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 4 || res.Next != nil {
		t.Fatalf("read %d rows, next %v", len(res.Changes), res.Next)
	}
	// The same rows one at a time: every chunk after the first is read
	// with a cursor, a prepared statement (binary rows), the first
	// without parameters (text rows). Both must give the binlog's values.
	var oneByOne []tidemark.Change
	var after []any
	for {
		r1, err := r.Read(ctx, tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: "t"}, Limit: 1, After: after, Snapshot: snap})
		if err != nil {
			t.Fatal(err)
		}
		oneByOne = append(oneByOne, r1.Changes...)
		if r1.Next == nil {
			break
		}
		after = r1.Next
	}
	if len(oneByOne) != 4 {
		t.Fatalf("read %d rows one at a time, want 4", len(oneByOne))
	}
	for i, rc := range oneByOne {
		for j, col := range rc.Table.Columns {
			if col.Kind != tidemark.KindJSON && !sameValue(rc.After[j], changes[i].After[j]) {
				t.Errorf("row %d column %s read with a cursor: reader %#v (%T), binlog %#v (%T)", i, col.Name, rc.After[j], rc.After[j], changes[i].After[j], changes[i].After[j])
			}
		}
	}
	for i, rc := range res.Changes {
		bc := changes[i]
		if rc.Table.Fingerprint() != bc.Table.Fingerprint() {
			t.Fatalf("schemas differ:\nreader %s\nbinlog %s", rc.Table.Fingerprint(), bc.Table.Fingerprint())
		}
		for j, col := range rc.Table.Columns {
			if col.Kind == tidemark.KindJSON {
				continue // same document, server-normalized text; compared by the sink as jsonb
			}
			if !sameValue(rc.After[j], bc.After[j]) {
				t.Errorf("row %d column %s: reader %#v (%T), binlog %#v (%T)", i, col.Name, rc.After[j], rc.After[j], bc.After[j], bc.After[j])
			}
		}
		// Captured after the last insert: the snapshot version is (S, 0)
		// with S at or after that transaction (other writers may have
		// committed since), newer than everything before S.
		if rc.Op != tidemark.OpRead || rc.Version != snap.Version || snap.Version.Seq < changes[3].Version.Seq {
			t.Fatalf("read change stamped %v %v; binlog %v", rc.Op, rc.Version, bc.Version)
		}
	}
	if got := res.Changes[0].After[res.Changes[0].Table.ColumnIndex("l1")]; got != "café €" {
		t.Fatalf("latin1 column read as %q", got)
	}
	// The verifier reads the same schema (readSchema, kindOf).
	v, err := NewVerifier(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Include: []string{db + ".*"}})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	vt, err := v.Table(ctx, tidemark.TableID{Database: db, Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if vt.Fingerprint() != changes[0].Table.Fingerprint() {
		t.Fatalf("schemas differ:\nverifier %s\nbinlog   %s", vt.Fingerprint(), changes[0].Table.Fingerprint())
	}
}

func TestReaderWindowsAndCursor(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("br_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE w (a INT, b VARCHAR(5), updated_at DATETIME(6), PRIMARY KEY (a, b), KEY (updated_at))")
	// 30 rows, 10 per IST hour: 10:00, 11:00, 12:00 local = 04:30, 05:30, 06:30 UTC.
	for i := 0; i < 30; i++ {
		exec(t, c, fmt.Sprintf("INSERT INTO w VALUES (%d, 'k%d', '2026-03-10 %02d:00:00')", i%7, i, 10+i/10))
	}
	loc, _ := time.LoadLocation("Asia/Kolkata")
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Zone: tidemark.ZonePolicy{Location: loc}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	id := tidemark.TableID{Database: db, Name: "w"}
	max, ok, err := r.MaxTime(ctx, id, "updated_at")
	if err != nil || !ok || !max.Equal(time.Date(2026, 3, 10, 6, 30, 0, 0, time.UTC)) {
		t.Fatalf("max = %v %v %v", max, ok, err)
	}
	// UTC window (04:30, 05:30] = the 11:00 IST rows only.
	lower := time.Date(2026, 3, 10, 4, 30, 0, 0, time.UTC)
	upper := time.Date(2026, 3, 10, 5, 30, 0, 0, time.UTC)
	var got []tidemark.Change
	var after []any
	chunks := 0
	for {
		res, err := r.Read(ctx, tidemark.ReadRequest{Table: id, Column: "updated_at", Lower: lower, Upper: upper, After: after, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.Changes...)
		chunks++
		if res.Next == nil {
			break
		}
		after = res.Next
	}
	if len(got) != 10 || chunks != 4 {
		t.Fatalf("window read %d rows in %d chunks, want 10 in 4", len(got), chunks)
	}
	seen := map[tidemark.Key]bool{}
	for _, ch := range got {
		if seen[ch.Key()] {
			t.Fatal("row read twice across chunks")
		}
		seen[ch.Key()] = true
		if v := ch.After[2].(time.Time); !v.Equal(upper) {
			t.Fatalf("row outside the window: %v", v)
		}
	}
	n, err := r.CountAbove(ctx, id, "updated_at", upper)
	if err != nil || n != 10 {
		t.Fatalf("count above = %d %v", n, err)
	}
	// Key listing and sums.
	kc, err := r.KeyChunk(ctx, id, nil, 25)
	if err != nil {
		t.Fatal(err)
	}
	if len(kc.Keys) != 25 || kc.Last == nil || kc.Sum.Count != 25 {
		t.Fatalf("key chunk: %d keys, last %v", len(kc.Keys), kc.Last)
	}
	s1, err := r.KeyRangeSum(ctx, id, nil, kc.Last)
	if err != nil || s1 != kc.Sum {
		t.Fatalf("range sum %v != chunk sum %v (%v)", s1, kc.Sum, err)
	}
	rest, err := r.KeyRangeSum(ctx, id, kc.Last, nil)
	if err != nil || rest.Count != 5 {
		t.Fatalf("rest %v %v", rest, err)
	}
	if _, _, err := r.MaxTime(ctx, id, "b"); err == nil {
		t.Fatal("a VARCHAR accepted as watermark column")
	}
}

// TestReaderWindowAcrossFold: in America/New_York the clocks go back at
// 2026-11-01 06:00Z (02:00 EDT → 01:00 EST), and 01:00–02:00 happens twice.
// A window that starts at 05:50Z (01:50 EDT) must still select a row
// written at 06:10Z (01:10 EST, stored as the digits 01:10): with the lower
// bound converted to "01:50" it was skipped.
func TestReaderWindowAcrossFold(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("br_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE f (id INT PRIMARY KEY, updated_at DATETIME(6) NOT NULL, KEY (updated_at))",
		// 1: 01:55 EDT (05:55Z); 2: 01:10 EST (06:10Z); 3: 00:30 EDT (04:30Z), before the window.
		"INSERT INTO f VALUES (1, '2026-11-01 01:55:00'), (2, '2026-11-01 01:10:00'), (3, '2026-11-01 00:30:00')")
	loc, _ := time.LoadLocation("America/New_York")
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Zone: tidemark.ZonePolicy{Location: loc}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	res, err := r.Read(context.Background(), tidemark.ReadRequest{Table: tidemark.TableID{Database: db, Name: "f"}, Column: "updated_at",
		Lower: time.Date(2026, 11, 1, 5, 50, 0, 0, time.UTC), Upper: time.Date(2026, 11, 1, 7, 0, 0, 0, time.UTC), Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]bool{}
	for _, ch := range res.Changes {
		got[ch.After[0].(int64)] = true
	}
	if !got[1] || !got[2] {
		t.Fatalf("window from 01:50 EDT read ids %v; want 1 (01:55 EDT) and 2 (01:10 EST, written after the bound)", got)
	}
}

// TestReaderUndatedRows: the rows no window selects — the watermark column
// NULL or a zero date (DATETIME and TIMESTAMP) — are exactly what an
// Undated read returns, in key order and through the cursor.
func TestReaderUndatedRows(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("br_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "SET SESSION sql_mode = ''",
		"CREATE TABLE u (id INT PRIMARY KEY, dt DATETIME(6) NULL, ts TIMESTAMP(6) NULL, KEY (dt), KEY (ts))",
		"INSERT INTO u VALUES (1, '2026-03-10 10:00:00', '2026-03-10 10:00:00'), (2, NULL, NULL), (3, '0000-00-00 00:00:00', '0000-00-00 00:00:00'), (4, '1000-01-01 00:00:00', '1970-01-01 00:00:01'), (5, NULL, '2026-03-10 11:00:00'), (6, '0000-00-00', NULL)")
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	id := tidemark.TableID{Database: db, Name: "u"}
	for col, want := range map[string]string{"dt": "[2 3 5 6]", "ts": "[2 3 6]"} {
		var got []int64
		var after []any
		for {
			res, err := r.Read(context.Background(), tidemark.ReadRequest{Table: id, Column: col, Undated: true, After: after, Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range res.Changes {
				got = append(got, ch.After[0].(int64))
			}
			if res.Next == nil {
				break
			}
			after = res.Next
		}
		if fmt.Sprint(got) != want {
			t.Errorf("undated rows by %s: %v, want %s", col, got, want)
		}
	}
}

// TestReaderRowsOwnTheirValues: Read streams a chunk's rows, and go-mysql
// reuses one buffer for every row's bytes. Each value a converter returns
// must be its own copy: a BLOB, text, JSON, DECIMAL or DATETIME kept as a
// view into that buffer would show a later row's bytes. 200 rows of
// different lengths are read in one chunk and compared with what was
// written, and the cursor of a full chunk is the last row's key.
func TestReaderRowsOwnTheirValues(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("br_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE o (k VARCHAR(20) NOT NULL PRIMARY KEY, bl BLOB, vb VARBINARY(300), tx TEXT, j JSON, d DECIMAL(20,4), dt DATETIME(6))")
	const n = 200
	text := func(i int) string { return fmt.Sprintf("%0*d", 1+(i*37)%250, i) }
	for i := 0; i < n; i++ {
		exec(t, c, fmt.Sprintf(`INSERT INTO o VALUES ('key-%03d', '%s', '%s', '%s', '{"i": %d, "s": "%s"}', %d.%04d, '2026-03-10 10:%02d:%02d.%06d')`,
			i, text(i), text(i+1), text(i+2), i, text(i+3), i*1000+7, i, i%60, (i*7)%60, i))
	}
	r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Zone: tidemark.ZonePolicy{Location: time.UTC}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	id := tidemark.TableID{Database: db, Name: "o"}
	for _, limit := range []int{n, n / 2} {
		res, err := r.Read(context.Background(), tidemark.ReadRequest{Table: id, After: []any{"key-"}, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Changes) != limit {
			t.Fatalf("read %d rows, want %d", len(res.Changes), limit)
		}
		for i, ch := range res.Changes {
			want := []any{fmt.Sprintf("key-%03d", i), []byte(text(i)), []byte(text(i + 1)), text(i + 2),
				tidemark.JSON(fmt.Sprintf(`{"i": %d, "s": "%s"}`, i, text(i+3))), tidemark.Decimal(fmt.Sprintf("%d.%04d", i*1000+7, i)),
				time.Date(2026, 3, 10, 10, i%60, (i*7)%60, i*1000, time.UTC)}
			for j, w := range want {
				if !sameValue(ch.After[j], w) {
					t.Fatalf("limit %d, row %d, column %s: %#v, want %#v", limit, i, ch.Table.Columns[j].Name, ch.After[j], w)
				}
			}
		}
		if want := fmt.Sprintf("key-%03d", limit-1); len(res.Next) != 1 || res.Next[0] != want {
			t.Fatalf("limit %d: cursor %#v, want [%q]", limit, res.Next, want)
		}
	}
}

// TestReaderLayoutChangedUnderIt: a Reader keeps the layout it read first;
// an ALTER before its next chunk makes the chunk's result types differ.
// A string column made an integer, and an integer column widened, are
// ErrLayoutChanged (the caller reads the layout again), not a value the
// older layout's converter refuses.
func TestReaderLayoutChangedUnderIt(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("br_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	for _, alter := range []string{"MODIFY COLUMN s INT NOT NULL", "MODIFY COLUMN n BIGINT NOT NULL"} {
		exec(t, c, "USE "+db, "DROP TABLE IF EXISTS l", "CREATE TABLE l (id INT PRIMARY KEY, s VARCHAR(10) NOT NULL, n INT NOT NULL)",
			"INSERT INTO l VALUES (1, '10', 1), (2, '20', 2)")
		r, err := NewReader(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: 1, Zone: tidemark.ZonePolicy{Location: time.UTC}})
		if err != nil {
			t.Fatal(err)
		}
		id := tidemark.TableID{Database: db, Name: "l"}
		if _, err := r.Read(context.Background(), tidemark.ReadRequest{Table: id, Limit: 1}); err != nil {
			t.Fatal(err)
		}
		exec(t, c, "ALTER TABLE l "+alter)
		_, err = r.Read(context.Background(), tidemark.ReadRequest{Table: id, After: []any{int64(1)}, Limit: 1})
		if !errors.Is(err, tidemark.ErrLayoutChanged) {
			t.Fatalf("%s between two chunks: %v, want ErrLayoutChanged", alter, err)
		}
		r.Close()
	}
}
