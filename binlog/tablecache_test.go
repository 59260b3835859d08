package binlog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
	"tidemark/internal/testenv"
)

// TestTableMapCacheManyTables: a source with more active tables than the old
// 4,096-layout limit reads each table's schema (indexes, JSON columns) from
// information_schema once, not again at every table map after the cache is
// cleared (review finding 19). Real MariaDB answers the schema reads.
func TestTableMapCacheManyTables(t *testing.T) {
	addr, user, pass, _ := testServer(t)
	db := testenv.Name("bc_")
	tl := newTailer(t, addr, user, pass, db, "UTC")
	t.Cleanup(func() { _ = tl.Close() })
	const tables = 5000
	tm := func(i int) *replication.TableMapEvent {
		return &replication.TableMapEvent{
			TableID: uint64(100 + i), Schema: []byte(db), Table: []byte(fmt.Sprintf("t%05d", i)),
			ColumnCount: 1, ColumnType: []byte{mysql.MYSQL_TYPE_LONG}, ColumnMeta: []uint16{0},
			ColumnName: [][]byte{[]byte("id")}, PrimaryKey: []uint64{0},
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := 0; i < tables; i++ {
		if _, err := tl.tableFor(ctx, tm(i)); err != nil {
			t.Fatal(err)
		}
	}
	first := tl.stats.SchemaReads.Load()
	if first == 0 {
		t.Fatal("no schema reads counted on the first pass")
	}
	// The stream goes on: every table gets a table map again (the same
	// layouts), twice.
	for pass := 0; pass < 2; pass++ {
		for i := 0; i < tables; i++ {
			if _, err := tl.tableFor(ctx, tm(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if again := tl.stats.SchemaReads.Load() - first; again != 0 {
		t.Fatalf("%d tables, layouts unchanged: %d schema reads on the first pass, %d more on the next two passes (want 0)", tables, first, again)
	}
	// A schema change of one table re-reads that table only.
	tl.dropLayouts(tidemark.TableID{Database: db, Name: "t00007"})
	delete(tl.jsonCols, tidemark.TableID{Database: db, Name: "t00007"})
	if _, err := tl.tableFor(ctx, tm(7)); err != nil {
		t.Fatal(err)
	}
	if _, err := tl.tableFor(ctx, tm(8)); err != nil {
		t.Fatal(err)
	}
	if n := tl.stats.SchemaReads.Load() - first; n != 2 {
		t.Fatalf("after a schema change of one table: %d schema reads, want 2 (its indexes and JSON columns)", n)
	}
}
