package binlog

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark/internal/testenv"
)

// TestDecodeRowsFindsInvalidDateTimes streams real rows events (inserts,
// two-image updates, deletes; DATETIME(0), (3) and (6) between columns of
// other types, NULLs, a long VARCHAR) through go-mysql with ParseTime and
// decodeRows: every DATETIME whose day does not exist arrives as its
// MariaDB text, every valid one as a time.Time with the same digits.
func TestDecodeRowsFindsInvalidDateTimes(t *testing.T) {
	addr, user, pass, c := testServer(t)
	db := testenv.Name("bd_")
	exec(t, c, "CREATE DATABASE "+db)
	t.Cleanup(func() { _, _ = c.Execute("DROP DATABASE " + db) })
	from := currentGTID(t, c)
	exec(t, c, "USE "+db, "SET sql_mode = 'ALLOW_INVALID_DATES'",
		`CREATE TABLE d (id INT PRIMARY KEY, a DATETIME NULL, v VARCHAR(400), b DATETIME(3) NULL, n DECIMAL(20,4), j JSON, c DATETIME(6) NULL, e ENUM('x','y'), bt BIT(3))`,
		`INSERT INTO d VALUES (1, '2026-03-10 23:58:00', REPEAT('v', 300), '2024-02-29 12:00:00.125', 1.5, '{"k": 1}', '2026-12-31 23:59:59.999999', 'y', b'101')`,
		`INSERT INTO d VALUES (2, '2026-02-30 10:00:00', 'w', NULL, -2.25, NULL, '2026-04-31 01:02:03.000004', 'x', b'1')`,
		`INSERT INTO d VALUES (3, NULL, NULL, '2025-02-29 00:00:00.5', NULL, '[]', NULL, NULL, NULL)`,
		`UPDATE d SET a = '2026-06-31 00:00:00', b = '2026-06-30 00:00:00' WHERE id = 1`,
		`DELETE FROM d WHERE id = 2`)

	h, p, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(p)
	syncer := replication.NewBinlogSyncer(replication.BinlogSyncerConfig{
		ServerID: testenv.ServerID(), Flavor: "mariadb", Host: h, Port: uint16(port), User: user, Password: pass,
		ParseTime: true, RowsEventDecodeFunc: func(e *replication.RowsEvent, data []byte) error { return decodeRows(e, data, nil) }, Logger: slog.New(slog.DiscardHandler),
	})
	defer syncer.Close()
	gs, err := mysql.ParseMariadbGTIDSet(from.GTID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := syncer.StartSyncGTID(gs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rows [][]any
	for len(rows) < 6 { // 3 inserts, an update's 2 images, a delete
		ev, err := st.GetEvent(ctx)
		if err != nil {
			t.Fatalf("after %d rows: %v", len(rows), err)
		}
		if re, ok := ev.Event.(*replication.RowsEvent); ok && string(re.Table.Schema) == db {
			rows = append(rows, re.Rows...)
		}
	}
	civil := func(v any) string {
		switch x := v.(type) {
		case time.Time:
			return "time " + x.Format("2006-01-02 15:04:05.999999")
		case string:
			return "text " + x
		case nil:
			return "NULL"
		}
		return "?"
	}
	want := [][3]string{ // a, b, c of each image
		{"time 2026-03-10 23:58:00", "time 2024-02-29 12:00:00.125", "time 2026-12-31 23:59:59.999999"},
		{"text 2026-02-30 10:00:00", "NULL", "text 2026-04-31 01:02:03.000004"},
		{"NULL", "text 2025-02-29 00:00:00.500", "NULL"},
		{"time 2026-03-10 23:58:00", "time 2024-02-29 12:00:00.125", "time 2026-12-31 23:59:59.999999"}, // before
		{"text 2026-06-31 00:00:00", "time 2026-06-30 00:00:00", "time 2026-12-31 23:59:59.999999"},     // after
		{"text 2026-02-30 10:00:00", "NULL", "text 2026-04-31 01:02:03.000004"},                         // deleted
	}
	for i, w := range want {
		got := [3]string{civil(rows[i][1]), civil(rows[i][3]), civil(rows[i][6])}
		if got != w {
			t.Errorf("image %d: a, b, c = %q, want %q", i, got, w)
		}
	}
	if rows[0][2] != strings.Repeat("v", 300) || rows[0][8] != int64(5) {
		t.Errorf("image 0 other columns: v %v, bt %v", rows[0][2], rows[0][8])
	}
}

// TestRowFilter: the rows of tables the config leaves out go undecoded; the
// answer per table is cached, also across table-map events of one table.
func TestRowFilter(t *testing.T) {
	cfg := Config{Include: []string{"shop.*"}, Exclude: []string{"shop.audit"}}
	f := &rowFilter{cfg: &cfg}
	tm := func(db, table string) *replication.TableMapEvent {
		return &replication.TableMapEvent{Schema: []byte(db), Table: []byte(table)}
	}
	for _, c := range []struct {
		db, table string
		skip      bool
	}{{"shop", "orders", false}, {"shop", "audit", true}, {"crm", "people", true}, {"shop", "orders", false}, {"mysql", "user", true}} {
		for i := 0; i < 2; i++ { // a second table-map event of the same table
			if got := f.skip(tm(c.db, c.table)); got != c.skip {
				t.Errorf("%s.%s: skip %v, want %v", c.db, c.table, got, c.skip)
			}
		}
	}
}
