package binlog

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/client"

	"tidemark"
	"tidemark/internal/testenv"
)

// testServer connects to the MariaDB started by scripts/services.sh.
func testServer(t *testing.T) (addr, user, pass string, c *client.Conn) {
	t.Helper()
	s := testenv.MySQL(t)
	return s.Addr, s.User, s.Password, s.Conn(t)
}

func exec(t *testing.T, c *client.Conn, sqls ...string) {
	t.Helper()
	for _, q := range sqls {
		if _, err := c.Execute(q); err != nil {
			t.Fatalf("exec %q: %v", q, err)
		}
	}
}

func currentGTID(t *testing.T, c *client.Conn) tidemark.Position {
	t.Helper()
	r, err := c.Execute("SELECT @@gtid_binlog_pos")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.GetString(0, 0)
	return tidemark.Position{GTID: s}
}

// collect streams until n commits of transactions with changes or DDL
// arrived or the timeout passes. The commits of other transactions (other
// tests' tables: tests of other packages write to the same server at the
// same time) end empty chunks and are not counted.
func collect(t *testing.T, tl *Tailer, from tidemark.Position, commits int) ([]tidemark.Change, []tidemark.Position) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make(chan tidemark.Chunk, 4)
	errc := make(chan error, 1)
	go func() { errc <- tl.Stream(ctx, from, out) }()
	var changes []tidemark.Change
	var positions []tidemark.Position
	ours := false // the open transaction had changes or DDL
	for len(positions) < commits {
		select {
		case ch := <-out:
			changes = append(changes, ch.Changes...)
			ours = ours || len(ch.Changes) > 0 || len(ch.DDL) > 0
			if !ch.Commit.IsZero() {
				if ours {
					positions = append(positions, ch.Commit)
				}
				ours = false
			}
		case err := <-errc:
			t.Fatalf("stream ended early: %v", err)
		case <-ctx.Done():
			t.Fatalf("timed out with %d of %d commits", len(positions), commits)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("stream: %v", err)
	}
	return changes, positions
}

func newTailer(t *testing.T, addr, user, pass, db string, zone string) *Tailer {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := New(Config{Name: "test", Addr: addr, User: user, Password: pass, ServerID: testenv.ServerID(),
		Include: []string{db + ".*"}, Zone: tidemark.ZonePolicy{Location: loc}, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func TestTailerDecodesEveryType(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bt_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, `CREATE TABLE t (
		id INT NOT NULL, region VARCHAR(10) NOT NULL,
		ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
		ii INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
		d DECIMAL(30,10), f FLOAT, dbl DOUBLE, c CHAR(5), vc VARCHAR(100), tx TEXT, bl BLOB,
		bn BINARY(4), vb VARBINARY(10), e ENUM('new','paid','shipped'), st SET('a','b','c'),
		bt BIT(10), y YEAR, dt DATE, tm TIME(6), dtm DATETIME(6), ts TIMESTAMP(6) NULL, j JSON,
		PRIMARY KEY (id, region)) DEFAULT CHARSET=utf8mb4`)
	from := currentGTID(t, c)
	exec(t, c, "SET time_zone = '+00:00'", "BEGIN",
		`INSERT INTO t VALUES (1, 'eu', -128, 255, -32768, -8388608, 16777215, -2147483648, 4294967295,
			-9223372036854775808, 18446744073709551615, '-12345678901234567890.0123456789', 1.5, 2.25,
			'ab', 'héllo 🐳', 'long text', X'00FF10', X'01020304', X'0001', 'paid', 'a,c', b'1010101010', 2026,
			'2026-03-10', '-838:59:59.000000', '2026-03-10 23:58:00.123456', '2026-03-10 12:00:00.5', '{"a": [1, 2, {"b": null}]}')`,
		`INSERT INTO t (id, region) VALUES (2, 'us')`,
		"COMMIT",
		"UPDATE t SET vc = 'changed', bu = 0 WHERE id = 1",
		"DELETE FROM t WHERE id = 2")
	tl := newTailer(t, addr, user, pass, db, "Asia/Kolkata")
	changes, positions := collect(t, tl, from, 3)
	if len(changes) != 4 {
		t.Fatalf("got %d changes, want 4", len(changes))
	}
	ins := changes[0]
	if ins.Op != tidemark.OpInsert || ins.Table.ID.Name != "t" {
		t.Fatalf("first change %v on %v", ins.Op, ins.Table.ID)
	}
	if got := ins.Table.KeyNames(); strings.Join(got, ",") != "id,region" {
		t.Fatalf("key %v", got)
	}
	want := map[string]any{
		"id": int64(1), "region": "eu", "ti": int64(-128), "tu": uint64(255), "si": int64(-32768), "mi": int64(-8388608),
		"mu": uint64(16777215), "ii": int64(-2147483648), "iu": uint64(4294967295), "bi": int64(-9223372036854775808),
		"bu": uint64(18446744073709551615), "d": tidemark.Decimal("-12345678901234567890.0123456789"), "f": float32(1.5),
		"dbl": 2.25, "c": "ab", "vc": "héllo 🐳", "tx": "long text", "bl": "\x00\xff\x10", "bn": "\x01\x02\x03\x04",
		"vb": "\x00\x01", "e": "paid", "st": "a,c", "bt": uint64(0b1010101010), "y": int64(2026),
		"dt": time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC), "tm": -(838*time.Hour + 59*time.Minute + 59*time.Second),
		"dtm": time.Date(2026, 3, 10, 18, 28, 0, 123456000, time.UTC), "ts": time.Date(2026, 3, 10, 12, 0, 0, 500000000, time.UTC),
	}
	for i, col := range ins.Table.Columns {
		v := ins.After[i]
		if col.Name == "j" {
			if col.Kind != tidemark.KindJSON {
				t.Fatalf("j kind %v, want json", col.Kind)
			}
			js, _ := v.(tidemark.JSON)
			if !strings.Contains(string(js), `"b"`) {
				t.Fatalf("j = %v", v)
			}
			continue
		}
		w := want[col.Name]
		switch x := v.(type) {
		case []byte:
			if string(x) != w {
				t.Errorf("%s = %x, want %x", col.Name, x, w)
			}
		case time.Time:
			if !x.Equal(w.(time.Time)) || x.Location() != time.UTC {
				t.Errorf("%s = %v, want %v", col.Name, x, w)
			}
		default:
			if v != w {
				t.Errorf("%s = %#v (%T), want %#v (%T)", col.Name, v, v, w, w)
			}
		}
	}
	if ins2 := changes[1]; ins2.After[ins.Table.ColumnIndex("ts")] != nil || ins2.After[ins.Table.ColumnIndex("j")] != nil {
		t.Fatalf("NULLs not nil: %v", ins2.After)
	}
	if changes[0].Version.Seq != changes[1].Version.Seq || changes[1].Version.Index != 2 {
		t.Fatalf("versions in one transaction: %v %v", changes[0].Version, changes[1].Version)
	}
	upd := changes[2]
	if upd.Op != tidemark.OpUpdate || upd.Before[ins.Table.ColumnIndex("vc")] != "héllo 🐳" || upd.After[ins.Table.ColumnIndex("vc")] != "changed" {
		t.Fatalf("update images wrong: %v", upd)
	}
	if upd.Version.Compare(changes[1].Version) <= 0 {
		t.Fatal("later transaction has no larger version")
	}
	del := changes[3]
	if del.Op != tidemark.OpDelete || del.After != nil || del.Key() != ins.Table.KeyOf([]any{int64(2), "us"}) {
		t.Fatalf("delete wrong: %+v", del)
	}
	for i := 1; i < len(positions); i++ {
		if cmp, err := positions[i].Compare(positions[i-1]); err != nil || cmp <= 0 {
			t.Fatalf("positions not increasing: %v then %v (%v)", positions[i-1], positions[i], err)
		}
	}

	// Resuming from the first commit position streams only what follows.
	changes2, _ := collect(t, newTailer(t, addr, user, pass, db, "Asia/Kolkata"), positions[0], 2)
	if len(changes2) != 2 || changes2[0].Op != tidemark.OpUpdate || changes2[0].Version != upd.Version {
		t.Fatalf("resume from %v gave %d changes (first %v)", positions[0], len(changes2), changes2[0].Op)
	}
	// Resuming by file/position gives the same changes and versions.
	changes3, _ := collect(t, newTailer(t, addr, user, pass, db, "Asia/Kolkata"), tidemark.Position{File: positions[0].File, Offset: positions[0].Offset}, 2)
	if len(changes3) != 2 || changes3[1].Version != del.Version {
		t.Fatalf("resume by file/pos: %d changes", len(changes3))
	}
}

func TestTailerSplitsLargeTransaction(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bt_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	exec(t, c, "USE "+db, "CREATE TABLE big (id INT PRIMARY KEY, v VARCHAR(50))")
	from := currentGTID(t, c)
	exec(t, c, "INSERT INTO big SELECT seq, CONCAT('row', seq) FROM seq_1_to_2500")
	tl := newTailer(t, addr, user, pass, db, "UTC")
	tl.cfg.MaxChunkChanges = 1000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make(chan tidemark.Chunk, 8)
	go func() { _ = tl.Stream(ctx, from, out) }()
	var sizes []int
	for {
		ch := <-out
		if len(sizes) == 0 && len(ch.Changes) == 0 {
			continue // transactions of other tables (other tests) end here
		}
		sizes = append(sizes, len(ch.Changes))
		if !ch.Commit.IsZero() {
			break
		}
	}
	if len(sizes) != 3 || sizes[0] != 1000 || sizes[1] != 1000 || sizes[2] != 500 {
		t.Fatalf("chunks %v, want [1000 1000 500] with the commit on the last", sizes)
	}
}

func TestTailerPositionErrors(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bt_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	cur := currentGTID(t, c)
	set, err := tidemark.ParseMariaDBGTIDSet(cur.GTID)
	if err != nil || len(set) == 0 {
		t.Fatalf("gtid_binlog_pos %q: %v", cur.GTID, err)
	}
	ahead := tidemark.MariaDBGTIDSet{}
	for d, g := range set {
		g.Seq += 99999999
		ahead[d] = g
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tl := newTailer(t, addr, user, pass, db, "UTC")
	err = tl.Stream(ctx, tidemark.Position{GTID: ahead.String()}, make(chan tidemark.Chunk, 1))
	if !errors.Is(err, tidemark.ErrPositionAhead) || !strings.Contains(err.Error(), "tidemark catchup") {
		t.Fatalf("ahead GTID: err = %v, want ErrPositionAhead naming tidemark catchup", err)
	}
	// A file newer than the server's newest is not purged: the binlog was
	// reset (falling back would stamp the catch-up with versions lower than
	// the target's, and every row would be skipped).
	tl = newTailer(t, addr, user, pass, db, "UTC")
	err = tl.Stream(ctx, tidemark.Position{File: "mysql-bin.999999", Offset: 4}, make(chan tidemark.Chunk, 1))
	if !errors.Is(err, tidemark.ErrPositionAhead) || !strings.Contains(err.Error(), "behind the checkpoint") {
		t.Fatalf("file after the newest: err = %v, want ErrPositionAhead (behind the checkpoint)", err)
	}
	tl = newTailer(t, addr, user, pass, db, "UTC")
	err = tl.Stream(ctx, tidemark.Position{File: "mysql-bin.000000", Offset: 4}, make(chan tidemark.Chunk, 1))
	if !errors.Is(err, tidemark.ErrPositionPurged) {
		t.Fatalf("file before the oldest: err = %v, want ErrPositionPurged", err)
	}
	if strings.Contains(err.Error(), pass) {
		t.Fatal("password in error")
	}
}
