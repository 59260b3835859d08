package binlog

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/internal/testenv"
)

// verifyTestServer connects to the MariaDB of scripts/services.sh; the test
// fails (never skips) without it.
func verifyTestServer(t *testing.T) (Config, *client.Conn) {
	t.Helper()
	s := testenv.MySQL(t)
	return Config{Name: "verifytest", Addr: s.Addr, User: s.User, Password: s.Password, ServerID: 7301}, s.Conn(t)
}

func vExec(t *testing.T, c *client.Conn, sqls ...string) {
	t.Helper()
	for _, q := range sqls {
		if _, err := c.Execute(q); err != nil {
			t.Fatalf("exec %q: %v", q, err)
		}
	}
}

// vDatabase creates a random database, dropped at cleanup.
func vDatabase(t *testing.T, c *client.Conn) string {
	t.Helper()
	return testenv.Database(t, c, "vt_")
}

func TestVerifierTableSchema(t *testing.T) {
	cfg, c := verifyTestServer(t)
	db := vDatabase(t, c)
	vExec(t, c, "USE "+db, `CREATE TABLE k (
		b BIGINT UNSIGNED NOT NULL, a VARCHAR(10) NOT NULL, amount DECIMAL(12,2), f FLOAT, d DOUBLE, bits BIT(5), y YEAR,
		dt DATETIME(6), ts TIMESTAMP(6) NULL, tm TIME(3), j JSON, e ENUM('x','y'), s SET('p','q'), bin VARBINARY(8), tx TEXT,
		PRIMARY KEY (a, b))`)
	cfg.BusinessKeys = map[string][]string{db + ".other": {"x"}}
	v, err := NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	ctx := context.Background()
	tbl, err := v.Table(ctx, tidemark.TableID{Database: db, Name: "k"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]tidemark.Kind{"b": tidemark.KindUint, "a": tidemark.KindText, "amount": tidemark.KindDecimal, "f": tidemark.KindFloat,
		"d": tidemark.KindDouble, "bits": tidemark.KindBit, "y": tidemark.KindYear, "dt": tidemark.KindDateTime, "ts": tidemark.KindTimestamp,
		"tm": tidemark.KindTime, "j": tidemark.KindJSON, "e": tidemark.KindEnum, "s": tidemark.KindSet, "bin": tidemark.KindBytes, "tx": tidemark.KindText}
	for _, col := range tbl.Columns {
		if want[col.Name] != col.Kind {
			t.Errorf("column %s: kind %s, want %s", col.Name, col.Kind, want[col.Name])
		}
	}
	if got := strings.Join(tbl.KeyNames(), ","); got != "a,b" {
		t.Errorf("key %s, want a,b (primary key order)", got)
	}
	if c := tbl.Columns[tbl.ColumnIndex("amount")]; c.Precision != 12 || c.Scale != 2 {
		t.Errorf("decimal %d,%d", c.Precision, c.Scale)
	}
	ids, err := v.Tables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, id := range ids {
		found = found || id == tbl.ID
		if id.Database == "mysql" {
			t.Errorf("system table %s listed", id)
		}
	}
	if !found {
		t.Errorf("%s not listed in %v", tbl.ID, ids)
	}
}

// TestVerifierChunks walks a table with a composite key (integer, text in
// byte order) in chunks and checks that the chunks partition it exactly.
func TestVerifierChunks(t *testing.T) {
	cfg, c := verifyTestServer(t)
	db := vDatabase(t, c)
	vExec(t, c, "USE "+db, "CREATE TABLE t (g INT NOT NULL, name VARCHAR(20) NOT NULL, v INT, PRIMARY KEY (g, name)) DEFAULT CHARSET=utf8mb4 COLLATE utf8mb4_general_ci")
	var vals []string
	names := []string{"a", "B", "c", "é", "Z", "ab", "a b"}
	for g := 0; g < 5; g++ {
		for i, n := range names {
			vals = append(vals, "("+strconv.Itoa(g)+", '"+n+"', "+strconv.Itoa(g*10+i)+")")
		}
	}
	vExec(t, c, "INSERT INTO t VALUES "+strings.Join(vals, ","))
	v, err := NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	ctx := context.Background()
	tbl, err := v.Table(ctx, tidemark.TableID{Database: db, Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	spec := &tidemark.VerifySpec{Table: tbl, TargetSchema: db}
	whole, err := v.Checksum(ctx, spec, tidemark.KeyRange{})
	if err != nil {
		t.Fatal(err)
	}
	if whole.Rows != 35 || whole.Sum == 0 {
		t.Fatalf("whole table: %+v", whole)
	}
	for _, size := range []int{1, 3, 7, 34, 35, 100} {
		var lo []string
		var rows int64
		var sum uint64
		seen := map[string]bool{}
		var prev string
		for n := 0; ; n++ {
			if n > 100 {
				t.Fatal("chunking does not end")
			}
			hi, ok, err := v.NextBound(ctx, spec, lo, size)
			if err != nil {
				t.Fatal(err)
			}
			r := tidemark.KeyRange{Lo: lo}
			if ok {
				r.Hi = hi
			}
			cs, err := v.Checksum(ctx, spec, r)
			if err != nil {
				t.Fatal(err)
			}
			if ok && cs.Rows != int64(size) {
				t.Fatalf("size %d: chunk %s has %d rows", size, r, cs.Rows)
			}
			ds, err := v.Digests(ctx, spec, r)
			if err != nil {
				t.Fatal(err)
			}
			var x uint64
			for _, d := range ds {
				k := strings.Join(d.Key, "|")
				if seen[k] {
					t.Fatalf("size %d: key %s in two chunks", size, k)
				}
				seen[k] = true
				x ^= d.Hash
			}
			if x != cs.Sum || int64(len(ds)) != cs.Rows {
				t.Fatalf("size %d: digests of %s (%d rows, %x) disagree with checksum %+v", size, r, len(ds), x, cs)
			}
			if ok {
				// Bounds ascend in byte order.
				b := hi[0] + "\x00" + hi[1]
				if len(hi[0]) == 1 && prev != "" && b <= prev {
					t.Fatalf("size %d: bound %v not after %q", size, hi, prev)
				}
				prev = b
			}
			rows += cs.Rows
			sum ^= cs.Sum
			if !ok {
				break
			}
			lo = hi
		}
		if rows != whole.Rows || sum != whole.Sum || len(seen) != 35 {
			t.Fatalf("size %d: chunks hold %d rows (%x), table %d (%x)", size, rows, sum, whole.Rows, whole.Sum)
		}
	}
	// A changed value changes the checksum; Rows reads the canonical row.
	vExec(t, c, "UPDATE t SET v = v + 1 WHERE g = 2 AND name = 'é'")
	after, err := v.Checksum(ctx, spec, tidemark.KeyRange{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Sum == whole.Sum || after.Rows != whole.Rows {
		t.Fatalf("update not seen: %+v vs %+v", after, whole)
	}
	rows, err := v.Rows(ctx, spec, [][]string{{"2", "é"}, {"9", "none"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := rows["2\x00é"]; len(r) != 3 || r[2] == nil || *r[2] != "24" || len(rows) != 1 {
		t.Fatalf("rows: %v (v = %s)", rows, *rows["2\x00é"][2])
	}
}

// currentFile returns the binlog file being written.
func currentFile(t *testing.T, c *client.Conn) string {
	t.Helper()
	r, err := c.Execute("SHOW MASTER STATUS")
	if err != nil {
		t.Fatal(err)
	}
	f, _ := r.GetString(0, 0)
	return f
}

// setExpire sets the server's binlog expiry; the old value is restored at
// cleanup. 30 days purges nothing on the test server (it is younger), so
// rotating binlogs in this test cannot take positions from other tests.
//
// Tests in other packages change the same global: they all hold the named
// lock "tidemark_test_binlog_expire" while they do.
func setExpire(t *testing.T, c *client.Conn, secs int64) {
	t.Helper()
	r, err := c.Execute("SELECT GET_LOCK('tidemark_test_binlog_expire', 120)")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := r.GetInt(0, 0); ok != 1 {
		t.Fatal("could not take the lock on binlog_expire_logs_seconds")
	}
	t.Cleanup(func() { _, _ = c.Execute("SELECT RELEASE_LOCK('tidemark_test_binlog_expire')") })
	r, err = c.Execute("SELECT @@global.binlog_expire_logs_seconds")
	if err != nil {
		t.Fatal(err)
	}
	old, _ := r.GetInt(0, 0)
	vExec(t, c, "SET GLOBAL binlog_expire_logs_seconds = "+strconv.FormatInt(secs, 10))
	t.Cleanup(func() { _, _ = c.Execute("SET GLOBAL binlog_expire_logs_seconds = " + strconv.FormatInt(old, 10)) })
}

func TestRetentionShrinksWhenBinlogsRotate(t *testing.T) {
	cfg, c := verifyTestServer(t)
	v, err := NewVerifier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	ctx := context.Background()
	const expire = 30 * 24 * time.Hour

	t.Run("unbounded", func(t *testing.T) {
		setExpire(t, c, 0)
		r, err := v.Retention(ctx, tidemark.Position{File: currentFile(t, c), Offset: 4}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if !r.Unbounded || r.Expire != 0 {
			t.Fatalf("expire 0: %+v, want unbounded", r)
		}
	})

	setExpire(t, c, int64(expire/time.Second))
	pos := tidemark.Position{File: currentFile(t, c), Offset: 4}
	open, err := v.Retention(ctx, pos, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !open.Open || open.Unbounded || open.Purged || open.Headroom != expire || open.Files < 1 {
		t.Fatalf("checkpoint in the current file: %+v, want open with headroom %s", open, expire)
	}
	before := time.Now()
	vExec(t, c, "FLUSH BINARY LOGS")
	time.Sleep(1100 * time.Millisecond)
	now := time.Now()
	closed, err := v.Retention(ctx, pos, now)
	if err != nil {
		t.Fatal(err)
	}
	if closed.Open || closed.Purged || closed.Files != open.Files+1 {
		t.Fatalf("after rotation: %+v", closed)
	}
	if closed.ClosedAt.Before(before.Truncate(time.Second).Add(-2*time.Second)) || closed.ClosedAt.After(now) {
		t.Fatalf("closed at %s, rotated at %s", closed.ClosedAt, before)
	}
	if !closed.PurgeAfter.Equal(closed.ClosedAt.Add(expire)) {
		t.Fatalf("purge after %s, want closed + %s", closed.PurgeAfter, expire)
	}
	if closed.Headroom >= open.Headroom || closed.Headroom < expire-time.Minute {
		t.Fatalf("headroom %s after rotation, %s before: want it to shrink (by seconds)", closed.Headroom, open.Headroom)
	}
	// It keeps shrinking with time.
	later, err := v.Retention(ctx, pos, now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if later.Headroom != closed.Headroom-24*time.Hour {
		t.Fatalf("a day later: %s, want %s", later.Headroom, closed.Headroom-24*time.Hour)
	}

	gone, err := v.Retention(ctx, tidemark.Position{File: "mysql-bin.000000", Offset: 4}, now)
	if err != nil {
		t.Fatal(err)
	}
	if !gone.Purged {
		t.Fatalf("missing file: %+v, want purged", gone)
	}
}
