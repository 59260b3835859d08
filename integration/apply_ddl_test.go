package integration

import (
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// TestApplyFollowsSchemaAndTruncate runs the scale-out topology (tailer and
// two appliers, 4 partitions) through an ALTER TABLE ADD COLUMN and a
// TRUNCATE with writes before and after each, then a RENAME COLUMN: the
// appliers create the new column from the schema record before any row
// that has it, every partition's applier removes the rows older than the
// TRUNCATE (and only those), the rename's re-snapshot fills the renamed
// column of every row, and the backfill after an ADD COLUMN with a default
// fills the new column. The target then equals the source row by row. Admin commands
// beside the tailer neither fence it nor run what needs the source's lock
// (catchup).
func TestApplyFollowsSchemaAndTruncate(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applyddl_", 97, "")
	defer ps.killAll()
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	converge("before the TRUNCATE")
	// Admin commands beside the running tailer: checkpoint reads Kafka's
	// checkpoint without fencing it; catchup takes the source's lock (held
	// by the tailer) and refuses.
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
	if code, out := runBinary(t, 60*time.Second, env, "checkpoint", "--config", r.cfg); code != 0 || !strings.Contains(out, "gtid=") {
		t.Fatalf("checkpoint: exit %d\n%s", code, out)
	}
	if code, out := runBinary(t, 60*time.Second, env, "catchup", "--config", r.cfg, "--table", r.db+".orders"); code == 0 || !strings.Contains(out, "is streaming source") {
		t.Fatalf("catchup beside the tailer: exit %d, want a refusal\n%s", code, out)
	}
	if err := harness.Exec(f.my, "TRUNCATE TABLE "+r.db+".orders"); err != nil {
		t.Fatal(err)
	}
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	converge("after the TRUNCATE")
	// The workload inserts without a column list: the ALTER comes last.
	if err := harness.Exec(f.my, "ALTER TABLE "+r.db+".orders ADD COLUMN extra_note VARCHAR(20) NULL"); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "UPDATE "+r.db+".orders SET extra_note = 'after alter' WHERE order_id % 3 = 0"); err != nil {
		t.Fatal(err)
	}
	converge("after the ALTER")
	// A column rename: the schema record names the new column only, so
	// the tailer re-snapshots the table for the appliers (the renamed
	// column's values of rows the UPDATE does not touch come from it).
	if err := harness.Exec(f.my, "ALTER TABLE "+r.db+".orders RENAME COLUMN extra_note TO extra_label"); err != nil {
		t.Fatal(err)
	}
	if err := harness.Exec(f.my, "UPDATE "+r.db+".orders SET extra_label = 'after rename' WHERE order_id % 5 = 0"); err != nil {
		t.Fatal(err)
	}
	converge("after the RENAME COLUMN")
	// A column with a default: the existing rows get it without a binlog
	// row, so the tailer re-snapshots the table (backfill) for the
	// appliers.
	if err := harness.Exec(f.my, "ALTER TABLE "+r.db+".orders ADD COLUMN flag VARCHAR(8) NOT NULL DEFAULT 'dflt'"); err != nil {
		t.Fatal(err)
	}
	converge("after the ADD COLUMN with a default (backfill)")
	if truncated := ps.count(1, "truncated target rows older than a source TRUNCATE"); truncated != 4 {
		t.Errorf("the appliers ran the TRUNCATE %d times, want once per partition (4)", truncated)
	}
}

// TestApplyFollowsDropTable runs the scale-out topology (tailer and two
// appliers, 4 partitions) with ddl.drop_table: apply through a DROP TABLE
// and the table created again under the same name: every partition's
// applier runs the DROP once, after the rows before it; the target table
// is gone until the new table's rows arrive, announced by their schema
// record again; the target then equals the source row by row.
func TestApplyFollowsDropTable(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applydrop_", 98, "    ddl: {drop_table: apply}\n")
	defer ps.killAll()
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	converge("before the DROP")
	if err := harness.Exec(f.my, "DROP TABLE "+r.db+".orders"); err != nil {
		t.Fatal(err)
	}
	if !testenv.WaitFor(120*time.Second, func() bool {
		var gone bool
		err := f.pg.QueryRow(f.ctx, "SELECT to_regclass($1) IS NULL", `"`+r.db+`".orders`).Scan(&gone)
		return err == nil && gone
	}) {
		t.Fatalf("the target table is still there after the source DROP TABLE:\n%s\n%s", tail(ps.procs[1].stderr.String(), 12), tail(ps.procs[2].stderr.String(), 12))
	}
	ps.alive("after the DROP")
	if err := harness.Exec(f.my, "USE "+r.db, harness.OrdersDDL); err != nil {
		t.Fatal(err)
	}
	if err := r.w.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	converge("after the table was created again")
	if dropped := ps.count(1, "dropped target rows older than a source DROP TABLE"); dropped != 4 {
		t.Errorf("the appliers ran the DROP %d times, want once per partition (4)", dropped)
	}
}

// converge waits up to 120 s until the target equals the source, then
// checks that every process still runs; it fails the test otherwise,
// showing each process's last lines.
func (p *procSet) converge(spec harness.TableSpec, step string) {
	p.t.Helper()
	var diff *harness.Diff
	if !testenv.WaitFor(120*time.Second, func() bool {
		d, err := harness.Compare(p.f.ctx, p.f.my, p.f.pg, spec)
		if err != nil {
			return false
		}
		diff = d
		return d.Equal()
	}) {
		msg := ""
		for i, d := range p.procs {
			msg += fmt.Sprintf("\nprocess %d:\n%s", i, tail(withoutLines(d.stderr.String(), "apply status"), 25))
		}
		examples := ""
		if diff != nil {
			examples = strings.Join(diff.Examples, "\n")
		}
		p.t.Fatalf("%s: target did not converge: %v\n%s%s", step, diff, examples, msg)
	}
	p.alive(step)
}

// alive fails the test if a process exited.
func (p *procSet) alive(step string) {
	p.t.Helper()
	for i, d := range p.procs {
		if d.exited() {
			p.t.Fatalf("%s: process %d exited:\n%s", step, i, tail(d.stderr.String(), 20))
		}
	}
}

// TestApplyFollowsResync runs the scale-out topology (tailer and two
// appliers, 4 partitions) through two resyncs of a table whose source rows
// changed without the binlog (sql_log_bin=0: rows deleted, rows updated):
// one requested from the running tailer, one run by `tidemark resync`
// while no tailer runs (the appliers keep running). Each time the snapshot's
// rows reach every partition between its boundaries, every partition's
// applier removes at the end boundary the rows the snapshot did not carry,
// and the target equals the source row by row; the stream goes on after
// each.
func TestApplyFollowsResync(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applyresync_", 99, "")
	defer ps.killAll()
	tailer, appliers := ps.procs[0], ps.procs[1:]
	env := []string{"TM_IT_MYSQL_PASSWORD=" + f.env.MySQLPassword, "TM_IT_PG_DSN=" + f.env.PGDSN}
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	behindBinlog := func(mod int) {
		t.Helper()
		if err := harness.Exec(f.my, "SET SESSION sql_log_bin = 0",
			fmt.Sprintf("DELETE FROM %s.orders WHERE order_id %% %d = 0 AND order_id > 1", r.db, mod),
			fmt.Sprintf("UPDATE %s.orders SET note = 'changed without the binlog' WHERE order_id %% %d = 1 AND order_id > 1", r.db, mod),
			"SET SESSION sql_log_bin = 1"); err != nil {
			t.Fatal(err)
		}
		if d, err := harness.Compare(f.ctx, f.my, f.pg, spec); err != nil || d.Equal() {
			t.Fatalf("the source changed without the binlog, but the target still equals it (%v): the test would prove nothing", err)
		}
	}
	ended := func() int {
		n := 0
		for _, d := range appliers {
			n += strings.Count(d.stderr.String(), "snapshot of a table ends on the partition")
		}
		return n
	}
	if err := r.w.Run(60); err != nil {
		t.Fatal(err)
	}
	converge("before the resyncs")

	// 1. Requested from the running tailer.
	behindBinlog(4)
	code, out := runBinary(t, 120*time.Second, env, "resync", "--config", r.cfg, "--table", r.db+".orders", "--wait", "100s")
	if code != 0 || !strings.Contains(out, "resync requested from the running daemon") || !strings.Contains(out, "resynced") {
		t.Fatalf("resync beside the tailer: exit %d\n%s\ntailer:\n%s", code, out, tail(tailer.stderr.String(), 15))
	}
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	converge("after the resync by the tailer")
	if n := ended(); n != 4 {
		t.Errorf("after one resync the appliers saw %d snapshot ends, want once per partition (4)", n)
	}

	// 2. With no tailer running: tidemark resync does it itself.
	tailer.kill()
	ps.procs = appliers
	behindBinlog(3)
	code, out = runBinary(t, 120*time.Second, env, "resync", "--config", r.cfg, "--table", r.db+".orders")
	if code != 0 || !strings.Contains(out, "resynced; the daemon streams it") {
		t.Fatalf("resync without a tailer: exit %d\n%s", code, out)
	}
	converge("after the resync without a tailer")
	ps.start("run", "--config", r.cfg)
	if err := r.w.Run(30); err != nil {
		t.Fatal(err)
	}
	converge("after the tailer started again")
	if n := ended(); n != 8 {
		t.Errorf("after two resyncs the appliers saw %d snapshot ends, want 8", n)
	}
}

// startDDLTopology starts a tailer and two appliers of a workload's
// database into topics of 4 partitions, with pg (lines of
// target.postgres) added to the config. converge waits until the target
// equals the source, all processes still running.
func startDDLTopology(t *testing.T, tag string, seed uint64, pg string) (*fixture, *kafkaRun, *procSet, func(step string)) {
	t.Helper()
	f := newFixture(t)
	r, _ := f.newApplyRun(t, tag, seed, 4, 50)
	if pg != "" {
		setYAML(t, r.cfg, "    schema: "+r.db+"\n", "    schema: "+r.db+"\n"+pg)
	}
	ps := &procSet{f: f, t: t}
	for _, args := range [][]string{{"run", "--config", r.cfg}, {"apply", "--config", r.cfg}, {"apply", "--config", r.cfg}} {
		ps.start(args...)
	}
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	return f, r, ps, func(step string) { t.Helper(); ps.converge(spec, step) }
}

// count counts the log lines containing what of the processes from the
// from-th on.
func (p *procSet) count(from int, what string) int {
	n := 0
	for _, d := range p.procs[from:] {
		n += strings.Count(d.stderr.String(), what)
	}
	return n
}

// withoutLines returns the lines of s that do not contain skip.
func withoutLines(s, skip string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, skip) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// ownsRE matches an applier's log line that says it was assigned some
// partitions.
var ownsRE = regexp.MustCompile(`msg="partitions assigned" .*partitions="?\[tk`)

// TestApplyDropAndCreateWithNewLayout runs the scale-out topology (tailer
// and two appliers, 4 partitions) with ddl.drop_table: apply through a
// DROP TABLE and a CREATE TABLE under the same name with one more column,
// while one applier is stopped; it dies, and its partitions, still with
// rows of the old layout to apply, move to members that never applied
// that layout, after the other one created the new table and wrote the
// new column. The older layout must not realign the table (the new
// column's values were wiped by DROP COLUMN + ADD COLUMN: review finding
// 3); the target then equals the source row by row.
func TestApplyDropAndCreateWithNewLayout(t *testing.T) {
	f, r, ps, converge := startDDLTopology(t, "it_applylayout_", 102, "    ddl: {drop_table: apply}\n")
	defer ps.killAll()
	lagging := ps.procs[2]
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	converge("before the DROP")
	if !testenv.WaitFor(60*time.Second, func() bool {
		owns := func(d *daemonProc) bool {
			return ownsRE.MatchString(d.stderr.String())
		}
		return owns(ps.procs[1]) && owns(lagging)
	}) {
		t.Fatalf("the two appliers do not share the partitions:\n%s\n%s", tail(ps.procs[1].stderr.String(), 5), tail(lagging.stderr.String(), 5))
	}
	if err := lagging.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = lagging.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	// Rows of the old layout on every partition, then the new table.
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	newDDL := strings.Replace(harness.OrdersDDL, "\tPRIMARY KEY", "\textra VARCHAR(20) NULL,\n\tPRIMARY KEY", 1)
	if err := harness.Exec(f.my, "DROP TABLE "+r.db+".orders", "USE "+r.db, newDDL); err != nil {
		t.Fatal(err)
	}
	var vals []string
	for i := range 200 {
		vals = append(vals, fmt.Sprintf("(%d, 1, 'new', 2.00, 'new', 'layout 2', NOW(6), NULL, 'extra %d')", 5_000_000+i, i))
	}
	if err := harness.Exec(f.my, "INSERT INTO "+r.db+".orders VALUES "+strings.Join(vals, ",")); err != nil {
		t.Fatal(err)
	}
	// The running applier drops the table, creates it anew and writes
	// its partitions' rows with the new column.
	// (Well within the group's session timeout, 45 s.)
	stopped := time.Now()
	if !testenv.WaitFor(20*time.Second, func() bool {
		var n int
		err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM "`+r.db+`".orders WHERE extra IS NOT NULL`).Scan(&n)
		return err == nil && n > 0
	}) {
		t.Fatalf("the running applier did not write the new layout's rows:\ntailer:\n%s\napplier:\n%s", tail(withoutLines(ps.procs[0].stderr.String(), "apply status"), 15),
			tail(withoutLines(ps.procs[1].stderr.String(), "apply status"), 15))
	}
	t.Logf("the new layout's rows were in after %s", time.Since(stopped).Round(time.Millisecond))
	// The lagging member dies; once the group expels it (the session
	// timeout), its partitions, still before their DROP record, go to
	// members that never applied their old layout.
	resumed = true
	lagging.kill()
	ps.procs = ps.procs[:2]
	ps.start("apply", "--config", r.cfg)
	converge("after the lagging partitions moved")
	for _, d := range ps.procs[1:] {
		if strings.Contains(d.stderr.String(), `DROP COLUMN \"extra\"`) {
			t.Errorf("an applier dropped the new column")
		}
	}
}
