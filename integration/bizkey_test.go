package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// Business keys on UNIQUE indexes (issue 22 §1, the seed incident's table):
// `id BIGINT AUTO_INCREMENT PRIMARY KEY`, `UNIQUE KEY (order_id,
// line_item_id)` and `business_keys: [order_id, line_item_id]`. The target's
// primary key is the business key, the upserts' ON CONFLICT arbiter; a
// mirrored unique index on exactly those columns would be a second,
// DEFERRABLE arbiter, which PostgreSQL refuses ("ON CONFLICT does not
// support deferrable unique constraints/exclusion constraints as
// arbiters"). Each table below is snapshotted first, then streams inserts,
// updates, deletes, key-changing updates and in-transaction swaps.

// bizkeyTables are the shapes of business key versus unique index.
var bizkeyTables = []struct {
	name, ddl string
	key       []string // business_keys (nil: the primary key)
}{
	// business key = a unique index (the seed incident), plus another
	// unique index that stays deferrable.
	{"eq", "CREATE TABLE eq (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id INT NOT NULL, line_item_id INT NOT NULL, qty INT, note VARCHAR(20)," +
		" UNIQUE KEY uk (order_id, line_item_id), UNIQUE KEY uq_note (note))", []string{"order_id", "line_item_id"}},
	// the same columns in another order
	{"eqrev", "CREATE TABLE eqrev (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id INT NOT NULL, line_item_id INT NOT NULL, qty INT, note VARCHAR(20)," +
		" UNIQUE KEY uk (line_item_id, order_id))", []string{"order_id", "line_item_id"}},
	// business key ⊂ a unique index
	{"sub", "CREATE TABLE sub (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id INT NOT NULL, line_item_id INT NOT NULL, qty INT, note VARCHAR(20)," +
		" UNIQUE KEY uk (order_id, line_item_id, qty))", []string{"order_id", "line_item_id"}},
	// business key ⊃ a unique index
	{"sup", "CREATE TABLE sup (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_id INT NOT NULL, line_item_id INT NOT NULL, qty INT, note VARCHAR(20)," +
		" UNIQUE KEY uk (order_id))", []string{"order_id", "line_item_id"}},
	// no business key: the primary key, a unique index repeating it, and
	// another unique index
	{"pk", "CREATE TABLE pk (id BIGINT PRIMARY KEY, order_id INT NOT NULL, line_item_id INT NOT NULL, qty INT, note VARCHAR(20)," +
		" UNIQUE KEY uq_id (id), UNIQUE KEY uq_note (note))", nil},
}

func bizkeySetup(t *testing.T, f *fixture, db string) {
	t.Helper()
	f.exec(t, "CREATE DATABASE IF NOT EXISTS "+db)
	for _, tb := range bizkeyTables {
		f.exec(t, "USE "+db, tb.ddl)
		// sup's unique index on order_id alone: one line per order.
		line := "seq % 3"
		if tb.name == "sup" {
			line = "1"
		}
		f.exec(t, "USE "+db, fmt.Sprintf("INSERT INTO %s (id, order_id, line_item_id, qty, note) SELECT seq, seq, %s, seq %% 5, CONCAT('n', seq) FROM seq_1_to_300", tb.name, line))
	}
}

// bizkeyStream writes every kind of change into each table.
func bizkeyStream(t *testing.T, f *fixture, db string, round int) {
	t.Helper()
	for _, tb := range bizkeyTables {
		n := tb.name
		base := 1000 * (round + 1)
		f.exec(t, "USE "+db,
			fmt.Sprintf("INSERT INTO %s (id, order_id, line_item_id, qty, note) VALUES (%d, %d, 1, 1, 'a%d'), (%d, %d, 1, 2, 'b%d')", n, base+1, base+1, round, base+2, base+2, round),
			fmt.Sprintf("UPDATE %s SET qty = qty + 10 WHERE id BETWEEN 10 AND 20", n),
			fmt.Sprintf("DELETE FROM %s WHERE id BETWEEN %d AND %d", n, 30+round*10, 35+round*10),
			// A key-changing update (the business key moves; id stays).
			fmt.Sprintf("UPDATE %s SET line_item_id = line_item_id + 100 WHERE id BETWEEN %d AND %d", n, 50+round*10, 52+round*10),
			// Two rows swap their notes (a unique index) and their
			// business keys in one transaction, row by row through a
			// temporary value.
			"BEGIN",
			fmt.Sprintf("UPDATE %s SET note = 'tmp' WHERE id = %d", n, 100+round),
			fmt.Sprintf("UPDATE %s SET note = 'n%d' WHERE id = %d", n, 100+round, 110+round),
			fmt.Sprintf("UPDATE %s SET note = 'n%d' WHERE id = %d", n, 110+round, 100+round),
			"COMMIT",
			"BEGIN",
			fmt.Sprintf("UPDATE %s SET order_id = -1 WHERE id = %d", n, 120+round),
			fmt.Sprintf("UPDATE %s SET order_id = %d WHERE id = %d", n, 120+round, 130+round),
			fmt.Sprintf("UPDATE %s SET order_id = %d WHERE id = %d", n, 130+round, 120+round),
			"COMMIT",
			// Delete and re-insert the same business key in one transaction.
			"BEGIN",
			fmt.Sprintf("DELETE FROM %s WHERE id = %d", n, 140+round),
			fmt.Sprintf("INSERT INTO %s (id, order_id, line_item_id, qty, note) VALUES (%d, %d, %s, 7, 'again%d')", n, base+3, 140+round, map[bool]string{true: "1", false: "140 % 3"}[n == "sup"], round),
			"COMMIT")
	}
}

func bizkeySourceLines(db string) string {
	s := "  business_keys:\n"
	for _, tb := range bizkeyTables {
		if tb.key != nil {
			s += fmt.Sprintf("    %s.%s: [%s]\n", db, tb.name, strings.Join(tb.key, ", "))
		}
	}
	return s
}

func (f *fixture) bizkeyCompare(t *testing.T, db, schema string, soft bool) {
	t.Helper()
	for _, tb := range bizkeyTables {
		f.compare(t, harness.TableSpec{Database: db, Table: tb.name, TargetSchema: schema, Key: tb.key, SourceZone: "UTC", SoftDelete: soft})
	}
}

func (f *fixture) requireNotQuarantined(t *testing.T, source, db string, d *daemonProc) {
	t.Helper()
	for _, tb := range bizkeyTables {
		if mode, reason := f.tableState(t, source, db, tb.name); mode == "quarantined" {
			t.Fatalf("%s quarantined: %s\n%s", tb.name, reason, tail(d.stderr.String(), 30))
		}
	}
	if s := d.stderr.String(); strings.Contains(s, "level=ERROR") {
		t.Fatalf("ERROR lines:\n%s", grepLines(s, "level=ERROR"))
	}
}

// TestBusinessKeyOnUniqueIndex: snapshot, then streamed changes, for every
// shape of business key versus unique index, with hard deletes under
// TZ=America/New_York and soft deletes under TZ=Asia/Kathmandu (a +05:45
// zone); plan names the arbiter; a target from an older release that has
// the deferrable constraint on the business key is migrated (the
// constraint tidemark created is dropped: the primary key enforces the same
// uniqueness), and one made by hand quarantines the table naming it.
func TestBusinessKeyOnUniqueIndex(t *testing.T) {
	for _, run := range []struct {
		name, tz string
		soft     bool
	}{{"hard", "America/New_York", false}, {"soft", "Asia/Kathmandu", true}} {
		t.Run(run.name, func(t *testing.T) {
			f := newFixture(t)
			db := testenv.Name("it_bizkey_")
			f.dropLater(t, db, db)
			f.forgetStates(t, db)
			bizkeySetup(t, f, db)
			pg := ""
			if run.soft {
				pg = "    delete_mode: soft\n"
			}
			cfg := f.schemaConfig(t, db, db, tidemark.Position{}, bizkeySourceLines(db), pg, "")

			plan, code := f.runPlan(t, cfg)
			if code != 0 {
				t.Fatalf("plan: exit %d\n%s", code, plan)
			}
			for _, want := range []string{
				`PRIMARY KEY ("order_id", "line_item_id")`,
				`-- upserts: ON CONFLICT ("order_id", "line_item_id"), the primary key (not deferrable)`,
				`-- source index uk is the business key: enforced by the primary key, not created again`,
				`-- source index uq_id is the business key: enforced by the primary key, not created again`,
			} {
				if !strings.Contains(plan, want) {
					t.Errorf("plan lacks %q:\n%s", want, plan)
				}
			}
			if strings.Contains(plan, `"eq_uk"`) || strings.Contains(plan, `"pk_uq_id"`) || !strings.Contains(plan, `"eq_uq_note"`) || !strings.Contains(plan, `"sub_uk"`) || !strings.Contains(plan, `"sup_uk"`) {
				t.Errorf("plan: unique indexes on the business key must not be created, the others must:\n%s", plan)
			}

			d := f.startDaemon(t, cfg, "TZ="+run.tz)
			defer cleanupDaemon(&d)
			f.waitCaughtUp(t, db, d)
			f.waitIndexes(t, db, "eq", "eq_uq_note")
			f.waitIndexes(t, db, "sup", "sup_uk")
			for round := 0; round < 3; round++ {
				bizkeyStream(t, f, db, round)
				f.waitCaughtUp(t, db, d)
				f.requireNotQuarantined(t, db, db, d)
			}
			f.bizkeyCompare(t, db, db, run.soft)
			for tb, want := range map[string]string{"eq": "eq_uq_note", "eqrev": "", "sub": "sub_uk", "sup": "sup_uk", "pk": "pk_uq_note"} {
				if got := keys(f.pgIndexes(t, db, tb)); got != want {
					t.Errorf("%s: target indexes %q, want %q", tb, got, want)
				}
			}
			f.stopOK(t, d)
			if run.soft {
				return
			}

			// A target an older release built: the deferrable constraint
			// on the business key, recorded as tidemark's own.
			f.addOldConstraint(t, db, "eq", "eq_uk", `UNIQUE ("order_id", "line_item_id") DEFERRABLE INITIALLY DEFERRED`, true)
			// One made by hand.
			f.addOldConstraint(t, db, "eqrev", "mine", `UNIQUE ("line_item_id", "order_id") DEFERRABLE`, false)
			d = f.startDaemon(t, cfg, "TZ="+run.tz)
			bizkeyStream(t, f, db, 3)
			f.waitCaughtUp(t, db, d)
			log := d.stderr.String()
			if !regexpContains(log, `dropping a deferrable constraint on the business key.*constraint=eq_uk`) {
				t.Errorf("no migration line for eq_uk:\n%s", grepLines(log, "eq"))
			}
			if mode, reason := f.tableState(t, db, db, "eqrev"); mode != "quarantined" ||
				!strings.Contains(reason, `constraint "mine" on the business key (order_id, line_item_id) is DEFERRABLE`) {
				t.Fatalf("eqrev: state %q reason %q\n%s", mode, reason, tail(log, 20))
			}
			for _, tb := range []string{"eq", "sub", "sup", "pk"} {
				f.compare(t, harness.TableSpec{Database: db, Table: tb, Key: map[bool][]string{true: nil, false: {"order_id", "line_item_id"}}[tb == "pk"], SourceZone: "UTC"})
			}
			if got := keys(f.pgIndexes(t, db, "eq")); got != "eq_uq_note" {
				t.Errorf("eq after migration: target indexes %q", got)
			}
			f.stopOK(t, d)
		})
	}
}

// addOldConstraint adds a constraint to a target table, recorded in its
// alignment comment as tidemark's own when managed (what an older release
// did).
func (f *fixture) addOldConstraint(t *testing.T, schema, table, name, def string, managed bool) {
	t.Helper()
	qname := fmt.Sprintf(`"%s"."%s"`, schema, table)
	create := fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT "%s" %s`, qname, name, def)
	if _, err := f.pg.Exec(f.ctx, create); err != nil {
		t.Fatal(err)
	}
	if !managed {
		return
	}
	var comment string
	if err := f.pg.QueryRow(f.ctx, "SELECT obj_description($1::regclass, 'pg_class')", qname).Scan(&comment); err != nil {
		t.Fatal(err)
	}
	var a map[string]any
	if err := json.Unmarshal([]byte(comment), &a); err != nil {
		t.Fatal(err)
	}
	ix, _ := a["indexes"].(map[string]any)
	if ix == nil {
		ix = map[string]any{}
	}
	ix[name] = create
	a["indexes"] = ix
	b, _ := json.Marshal(a)
	if _, err := f.pg.Exec(f.ctx, fmt.Sprintf("COMMENT ON TABLE %s IS '%s'", qname, strings.ReplaceAll(string(b), "'", "''"))); err != nil {
		t.Fatal(err)
	}
}

// TestApplyBusinessKeyOnUniqueIndex: the same tables through the scale-out
// topology (the tailer and two appliers, 4 partitions), hard and soft
// deletes. The appliers write through the same sink (they mirror no
// indexes: the change records carry none), so what they must survive is a
// target that has the deferrable constraint on the business key (one an
// older single daemon built): restarted appliers drop it and go on. With 4
// partitions a key-changing update goes to its new key's partition and the
// old key's delete rides with it, so the swaps through a temporary key (in
// one transaction and across transactions) reach the members in any order:
// the version guard and the tombstones must make every order converge.
func TestApplyBusinessKeyOnUniqueIndex(t *testing.T) {
	for _, soft := range []bool{false, true} {
		t.Run(fmt.Sprintf("soft=%v", soft), func(t *testing.T) {
			f := newFixture(t)
			r, _ := f.newApplyRun(t, "it_applybk_", 98, 4, 50)
			f.forgetStates(t, r.db)
			setYAML(t, r.cfg, "  heartbeat: 1s\n", "  heartbeat: 1s\n"+bizkeySourceLines(r.db))
			if soft {
				setYAML(t, r.cfg, "    schema: "+r.db+"\n", "    schema: "+r.db+"\n    delete_mode: soft\n")
			}
			bizkeySetup(t, f, r.db)
			ps := &procSet{f: f, t: t}
			defer ps.killAll()
			ps.start("run", "--config", r.cfg)
			ps.start("apply", "--config", r.cfg)
			ps.start("apply", "--config", r.cfg)
			converge := func(step string) {
				t.Helper()
				for _, tb := range bizkeyTables {
					ps.converge(harness.TableSpec{Database: r.db, Table: tb.name, Key: tb.key, SourceZone: "UTC", SoftDelete: soft}, step+": "+tb.name)
				}
			}
			for round := 0; round < 2; round++ {
				bizkeyStream(t, f, r.db, round)
				bizkeySwapAcross(t, f, r.db, round)
			}
			converge("streamed")
			// The deferrable constraint an older release left on the
			// business key; the appliers restart.
			def := `UNIQUE ("order_id", "line_item_id") DEFERRABLE INITIALLY DEFERRED`
			if soft {
				def = `EXCLUDE USING btree ("order_id" WITH =, "line_item_id" WITH =) WHERE (NOT "_tm_deleted") DEFERRABLE INITIALLY DEFERRED`
			}
			f.addOldConstraint(t, r.db, "eq", "eq_uk", def, true)
			for _, d := range ps.procs[1:] {
				d.kill()
			}
			ps.procs = ps.procs[:1]
			ps.start("apply", "--config", r.cfg)
			ps.start("apply", "--config", r.cfg)
			bizkeyStream(t, f, r.db, 2)
			bizkeySwapAcross(t, f, r.db, 2)
			converge("after the appliers' restart")
			for i, d := range ps.procs {
				if s := d.stderr.String(); d.exited() || strings.Contains(s, "level=ERROR") {
					t.Fatalf("process %d exited or logged an error:\n%s", i, tail(s, 20))
				}
			}
			if soft {
				// An exclusion constraint is no arbiter: it stays.
				if got := keys(f.pgIndexes(t, r.db, "eq")); got != "eq_uk" {
					t.Errorf("eq: target indexes %q, want eq_uk", got)
				}
				return
			}
			logs := ps.procs[1].stderr.String() + ps.procs[2].stderr.String()
			if got := keys(f.pgIndexes(t, r.db, "eq")); got != "" || !regexpContains(logs, `dropping a deferrable constraint on the business key.*constraint=eq_uk`) {
				t.Errorf("eq: target indexes %q, want the old constraint dropped:\n%s", got, tail(logs, 20))
			}
		})
	}
}

// bizkeySwapAcross swaps two rows' keys through a temporary key, one
// transaction per step (k1→tmp, k2→k1, tmp→k2), and then back again in one
// transaction: the business key where the table has one, else the primary
// key.
func bizkeySwapAcross(t *testing.T, f *fixture, db string, round int) {
	t.Helper()
	for _, tb := range bizkeyTables {
		n, col := tb.name, "order_id"
		if tb.key == nil {
			col = "id"
		}
		a, b := 200+round, 210+round
		f.exec(t, "USE "+db,
			fmt.Sprintf("UPDATE %s SET %s = -2 WHERE %s = %d", n, col, col, a),
			fmt.Sprintf("UPDATE %s SET %s = %d WHERE %s = %d", n, col, a, col, b),
			fmt.Sprintf("UPDATE %s SET %s = %d WHERE %s = -2", n, col, b, col),
			// and a changed value after the swap, in its own transaction
			fmt.Sprintf("UPDATE %s SET qty = qty + 1 WHERE %s IN (%d, %d)", n, col, a, b),
			"BEGIN",
			fmt.Sprintf("UPDATE %s SET %s = -3 WHERE %s = %d", n, col, col, b),
			fmt.Sprintf("UPDATE %s SET %s = %d WHERE %s = %d", n, col, b, col, a),
			fmt.Sprintf("UPDATE %s SET %s = %d WHERE %s = -3", n, col, a, col),
			"COMMIT")
	}
}
