package integration

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"tidemark/integration/harness"
)

// TestEpochFloorSurvivesCheckpointReset is review finding 10: the version
// epoch lived only in the checkpoint. With rows of epoch 1 in the target
// (here from a switch of the version scheme), an operator deletes the
// checkpoint row to start over (or sets a start_position): the daemon came
// back in epoch 0, and every update or delete of an existing row was
// counted `skipped` while the pipeline looked healthy. The highest epoch is
// now kept per source apart from the checkpoint (tidemark.source_epochs,
// written in the same transaction as the data) and the stream never goes
// below it.
func TestEpochFloorSurvivesCheckpointReset(t *testing.T) {
	f := newFixture(t)
	db, start, w := f.newWorkload(t, "it_efloor_", harness.Workload{Zone: "UTC", Rand: rand.New(rand.NewPCG(10, 1)), BigTxRows: 20})
	if err := w.Run(40); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	spec := harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"}
	// Epoch 0 under gtid, then epoch 1 under filepos: rows rewritten in
	// epoch 1.
	for _, scheme := range []string{"gtid", "filepos"} {
		setSourceOption(t, cfg, "version", scheme)
		if err := harness.Exec(f.my, "UPDATE orders SET amount = amount + 1"); err != nil {
			t.Fatal(err)
		}
		d := f.startDaemon(t, cfg)
		f.waitCaughtUp(t, db, d)
		if code := d.stop(t); code != 0 {
			t.Fatalf("%s: exit %d\n%s", scheme, code, d.stderr.String())
		}
	}
	f.compare(t, spec)
	pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db)
	if err != nil || pos.Epoch != 1 {
		t.Fatalf("checkpoint %s (%v): want epoch 1", pos, err)
	}
	// Start over from the current position without the checkpoint.
	here, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.pg.Exec(f.ctx, "DELETE FROM tidemark.checkpoints WHERE source = $1", db); err != nil {
		t.Fatal(err)
	}
	setSourceOption(t, cfg, "start_position", fmt.Sprintf("%q", here.String()))
	for j := 0; j < 10; j++ {
		if err := harness.Exec(f.my,
			fmt.Sprintf("UPDATE orders SET note = 'after reset', amount = amount + 1 WHERE order_id = %d", 1+j),
			fmt.Sprintf("DELETE FROM orders WHERE order_id = %d", 20+j)); err != nil {
			t.Fatal(err)
		}
	}
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	log := d.stderr.String()
	diff, err := harness.Compare(f.ctx, f.my, f.pg, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("after deleting the checkpoint of an epoch-1 target, the target differs from the source: %v\n%s", diff, grepLines(log, "stopped cleanly"))
	}
	if !strings.Contains(log, "skipped=0 ") {
		t.Fatalf("changes after the reset were skipped:\n%s", tail(log, 10))
	}
	if pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db); err != nil || pos.Epoch != 1 {
		t.Fatalf("checkpoint %s (%v) after the reset: want epoch 1 (the floor)", pos, err)
	}
}

// TestLegacyCheckpointOfAnotherServer is the first sequence of review
// finding 10: a checkpoint written before identities were stored
// (gtid=…;file=mysql-bin.000090;pos=…, no src=) was taken as the current
// server's, although its file is not in this server's binlog: the old
// server's filepos versions (90<<40|…) stayed above every version of the
// new one, whose binlog is at a lower file number, and every update was
// skipped. A legacy file/offset that the server cannot place
// (BINLOG_GTID_POS(file, pos) is not the checkpoint's GTID) is now another
// server's: resumed by GTID in the next epoch (rule 4).
func TestLegacyCheckpointOfAnotherServer(t *testing.T) {
	f := newFixture(t)
	db, start, w := f.newWorkload(t, "it_legacy_", harness.Workload{Zone: "UTC", Rand: rand.New(rand.NewPCG(11, 1)), BigTxRows: 20})
	if err := w.Run(40); err != nil {
		t.Fatal(err)
	}
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	setSourceOption(t, cfg, "version", "filepos")
	d := f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	spec := harness.TableSpec{Database: db, Table: "orders", SourceZone: "UTC"}
	f.compare(t, spec)
	// What an old release wrote on the old primary: its rows carry
	// versions of its mysql-bin.000090, its checkpoint no identity; this
	// server has the GTIDs.
	here, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	legacy := fmt.Sprintf("gtid=%s;file=mysql-bin.000090;pos=4242", here.GTID)
	for _, q := range []string{
		"UPDATE tidemark.checkpoints SET position = $2, file = 'mysql-bin.000090', pos = 4242 WHERE source = $1",
		"DELETE FROM tidemark.source_epochs WHERE source = $1",
	} {
		args := []any{db}
		if strings.Contains(q, "$2") {
			args = append(args, legacy)
		}
		if _, err := f.pg.Exec(f.ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf(`UPDATE %q.orders SET _tm_seq = (90::bigint << 40) | 4242`, db)); err != nil {
		t.Fatal(err)
	}
	for j := 0; j < 10; j++ {
		if err := harness.Exec(f.my, fmt.Sprintf("UPDATE orders SET note = 'on the new server', amount = amount + 1 WHERE order_id = %d", 1+j)); err != nil {
			t.Fatal(err)
		}
	}
	d = f.startDaemon(t, cfg)
	f.waitCaughtUp(t, db, d)
	if code := d.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.stderr.String())
	}
	log := d.stderr.String()
	diff, err := harness.Compare(f.ctx, f.my, f.pg, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !diff.Equal() {
		t.Fatalf("after a legacy checkpoint of another server, the target differs from the source: %v\n%s", diff, grepLines(log, "stopped cleanly"))
	}
	if pos, _, err := harness.StoredCheckpoint(f.ctx, f.pg, "", db); err != nil || pos.Epoch != 1 {
		t.Fatalf("checkpoint %s (%v): want epoch 1 (another server, followed by GTID)", pos, err)
	}
}
