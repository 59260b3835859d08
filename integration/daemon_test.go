package integration

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// The kill -9 scenario (F1) lives in rel_kill_test.go with the rest of the
// reliability suite.

// TestHostTimeZoneDoesNotLeak replicates the same workload twice, with the
// daemon under TZ=Asia/Kolkata and under TZ=UTC, into two target schemas,
// and requires identical target rows (and the IST incident value).
func TestHostTimeZoneDoesNotLeak(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_tz_")
	f.dropLater(t, db, db+"_ist", db+"_utc")
	t.Cleanup(func() {
		_, _ = f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+"_ist CASCADE")
		_, _ = f.pg.Exec(f.ctx, "DROP SCHEMA IF EXISTS "+db+"_utc CASCADE")
	})
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	w := &harness.Workload{My: f.my, Database: db, Zone: "Asia/Kolkata", Rand: rand.New(rand.NewPCG(5, 5)), BigTxRows: 100}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(300); err != nil {
		t.Fatal(err)
	}
	for _, run := range []struct{ tz, suffix string }{{"Asia/Kolkata", "_ist"}, {"UTC", "_utc"}} {
		cfg := f.configYAML(t, db+run.suffix, db, db+run.suffix, "Asia/Kolkata", start)
		d := f.startDaemon(t, cfg, "TZ="+run.tz)
		f.waitCaughtUp(t, db+run.suffix, d)
		if code := d.stop(t); code != 0 {
			t.Fatalf("TZ=%s: exit %d\n%s", run.tz, code, d.stderr.String())
		}
		f.compare(t, harness.TableSpec{Database: db, Table: "orders", TargetSchema: db + run.suffix, SourceZone: "Asia/Kolkata"})
	}
	dump := func(schema string) string {
		rows, err := f.pg.Query(f.ctx, "SELECT order_id, line_item_id, customer, amount::text, status, coalesce(note,'∅'), "+
			"extract(epoch from updated_at)::text, coalesce(extract(epoch from paid_at)::text, '∅'), _tm_seq, _tm_idx FROM "+schema+".orders ORDER BY 1, 2")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var b strings.Builder
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				b.WriteString(strings.TrimSpace(strings.ReplaceAll(fmt.Sprint(v), "\n", " ")))
				b.WriteByte('|')
			}
			b.WriteByte('\n')
		}
		return b.String()
	}
	ist, utc := dump(db+"_ist"), dump(db+"_utc")
	if ist != utc || len(ist) == 0 {
		t.Fatalf("target rows differ between TZ=Asia/Kolkata and TZ=UTC daemons (or are empty)")
	}
	var got time.Time
	if err := f.pg.QueryRow(f.ctx, "SELECT updated_at FROM "+db+"_utc.orders WHERE order_id = 0").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 3, 10, 18, 28, 0, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("'2026-03-10 23:58:00' IST arrived as %s, want %s", got.UTC(), want)
	}
}

// TestRestartResumesWithoutDuplicates stops the daemon cleanly, writes more,
// restarts it, and checks the second run applied only the new changes.
func TestRestartResumesWithoutDuplicates(t *testing.T) {
	f := newFixture(t)
	db, start, w := f.newWorkload(t, "it_restart_", harness.Workload{Zone: "Asia/Kolkata", Rand: rand.New(rand.NewPCG(11, 12)), BigTxRows: 50})
	if err := w.Run(100); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "Asia/Kolkata", start)
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"})
	// Single-row inserts only, so the second run's counts are exact.
	for i := 0; i < 20; i++ {
		if err := harness.Exec(f.my, "INSERT INTO orders VALUES ("+strconv.Itoa(100000+i)+", 1, 'late', 1.00, 'new', NULL, NOW(6), NULL)"); err != nil {
			t.Fatal(err)
		}
	}
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	f.compare(t, harness.TableSpec{Database: db, Table: "orders", SourceZone: "Asia/Kolkata"})
	log := d.stderr.String()
	if !strings.Contains(log, "inserted=20 ") || !strings.Contains(log, "skipped=0 ") || !strings.Contains(log, "resumed=true") {
		t.Fatalf("second run should resume and insert exactly the 20 new rows, skipping none:\n%s", log)
	}
}
