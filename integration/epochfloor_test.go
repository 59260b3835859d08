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
	db := randName("it_efloor_")
	f.dropLater(t, db, db)
	t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.source_epochs WHERE source = $1", db) })
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	w := &harness.Workload{My: f.my, Database: db, Zone: "UTC", Rand: rand.New(rand.NewPCG(10, 1)), BigTxRows: 20}
	if err := w.Setup(); err != nil {
		t.Fatal(err)
	}
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
