package integration

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// Index and NOT NULL mirroring end to end (docs/schema-changes.md, "Indexes
// and NOT NULL"): `tidemark plan` prints the DDL and runs none; the first
// snapshot loads the rows and then builds the indexes (unique ones as
// deferred unique constraints, prefixes as left(), FULLTEXT skipped with one
// log line); CREATE INDEX / ADD INDEX / DROP INDEX / MODIFY … NOT NULL are
// followed while the daemon runs; values swapped between two rows of a
// unique index in one transaction apply; and a NOT NULL the target's rows
// cannot satisfy quarantines the table until a resync.

// pgIndexes lists a target table's indexes other than the primary key as
// "name: definition" (constraints' indexes included).
func (f *fixture) pgIndexes(t *testing.T, schema, table string) map[string]string {
	t.Helper()
	// The primary key by pg_index: PostgreSQL cuts its name for a long
	// table name.
	rows, err := f.pg.Query(f.ctx, `SELECT x.indexname, x.indexdef FROM pg_indexes x JOIN pg_index i ON i.indexrelid = format('%I.%I', x.schemaname, x.indexname)::regclass
WHERE x.schemaname = $1 AND x.tablename = $2 AND NOT i.indisprimary`, schema, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, d string
		if err := rows.Scan(&n, &d); err != nil {
			t.Fatal(err)
		}
		out[n] = d
	}
	return out
}

// pgNotNull lists a target table's NOT NULL source columns.
func (f *fixture) pgNotNull(t *testing.T, schema, table string) string {
	t.Helper()
	return f.pgColumnsWhere(t, schema, table, "is_nullable = 'NO'")
}

// deferredUnique reports whether the target has a deferrable, initially
// deferred unique or exclusion constraint of that name.
func (f *fixture) deferredUnique(t *testing.T, name string) bool {
	t.Helper()
	var n int
	if err := f.pg.QueryRow(f.ctx, `SELECT count(*) FROM pg_constraint WHERE conname = $1 AND contype IN ('u', 'x') AND condeferrable AND condeferred`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func (f *fixture) runPlan(t *testing.T, config string) (string, int) {
	t.Helper()
	cmd := exec.Command(binPath, "plan", "--config", config)
	cmd.Env = append(cmd.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return string(out), code
}

// waitIndexes waits up to 30s for a target table's index list to be want.
func (f *fixture) waitIndexes(t *testing.T, schema, table, want string) map[string]string {
	t.Helper()
	var ix map[string]string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ix = f.pgIndexes(t, schema, table); keys(ix) == want {
			break
		}
	}
	return ix
}

func keys(m map[string]string) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestMirrorIndexesAndNotNull(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_mirror_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, email VARCHAR(100) NOT NULL, a INT NOT NULL, b INT, body TEXT, note VARCHAR(20), updated_at DATETIME(6) NOT NULL,"+
			" UNIQUE KEY uq_email (email), KEY k_upd (updated_at), KEY k_ab (a, b DESC), KEY k_body (body(10)), FULLTEXT KEY ft_body (body))",
		"INSERT INTO t SELECT seq, CONCAT('u', seq, '@x'), seq % 7, IF(seq % 3 = 0, NULL, seq), REPEAT('lorem ipsum ', seq % 50), NULL, '2026-01-01' + INTERVAL seq MINUTE FROM seq_1_to_500")
	cfg := f.configYAML(t, db, db, db, "UTC", tidemark.Position{})

	// plan: the DDL, nothing run.
	plan, code := f.runPlan(t, cfg)
	if code != 0 {
		t.Fatalf("plan: exit %d\n%s", code, plan)
	}
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "` + db + `"."t"`, `"email" text NOT NULL`, `"b" integer,`, `"note" text,`,
		`ADD CONSTRAINT "t_uq_email" UNIQUE ("email") DEFERRABLE INITIALLY DEFERRED`,
		`CREATE INDEX "t_k_ab" ON "` + db + `"."t" ("a", "b" DESC)`,
		`CREATE INDEX "t_k_body" ON "` + db + `"."t" ((left("body", 10)))`,
		`CREATE INDEX "t_k_upd"`,
	} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan lacks %q:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "t_ft_body") || !regexpContains(plan, `index not mirrored.*index=ft_body`) {
		t.Errorf("plan: the FULLTEXT index should be named as not mirrored, not planned:\n%s", plan)
	}
	if f.pgTableExists(t, db, "t") {
		t.Fatal("plan created the target table")
	}

	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	// The indexes are built right after the load committed.
	ix := f.waitIndexes(t, db, "t", "t_k_ab,t_k_body,t_k_upd,t_uq_email")
	if got := keys(ix); got != "t_k_ab,t_k_body,t_k_upd,t_uq_email" {
		t.Fatalf("target indexes %s\n%v\n%s", got, ix, d.stderr.String())
	}
	if !f.deferredUnique(t, "t_uq_email") {
		t.Fatal("uq_email is not a deferred unique constraint")
	}
	if got := f.pgNotNull(t, db, "t"); got != "id,email,a,updated_at" {
		t.Fatalf("NOT NULL columns %s, want id,email,a,updated_at", got)
	}
	log := d.stderr.String()
	if n := strings.Count(log, `msg="index not mirrored"`); n != 1 || !regexpContains(log, `index not mirrored.*index=ft_body.*FULLTEXT`) {
		t.Fatalf("want one line naming the skipped FULLTEXT index, got %d:\n%s", n, grepLines(log, "mirror"))
	}
	// Built after the load: the snapshot's rows were in before the first
	// index.
	if i, j := strings.Index(log, "mirroring the indexes"), strings.Index(log, `msg="table caught up"`); i < 0 || j < 0 || i < j {
		t.Fatalf("indexes not built after the snapshot:\n%s", grepLines(log, "snapshot")+grepLines(log, "mirror"))
	}

	// DDL while running.
	f.exec(t,
		"CREATE INDEX k_note ON t (note)",
		"ALTER TABLE t DROP INDEX k_upd, ADD UNIQUE KEY uq_ab (a, b)",
		"UPDATE t SET b = id, note = '' WHERE b IS NULL OR note IS NULL",
		"ALTER TABLE t MODIFY note VARCHAR(20) NOT NULL",
		"INSERT INTO t VALUES (1000, 'new@x', 1, 1000, 'x', 'n', '2026-02-01')",
		// Two rows swap their emails in one transaction: valid on the
		// source (row by row), one staged statement on the target.
		"BEGIN",
		"UPDATE t SET email = 'tmp' WHERE id = 1",
		"UPDATE t SET email = 'u1@x' WHERE id = 2",
		"UPDATE t SET email = 'u2@x' WHERE id = 1",
		"COMMIT")
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	ix = f.pgIndexes(t, db, "t")
	if got := keys(ix); got != "t_k_ab,t_k_body,t_k_note,t_uq_ab,t_uq_email" {
		t.Fatalf("target indexes after DDL %s", got)
	}
	if !f.deferredUnique(t, "t_uq_ab") {
		t.Fatal("uq_ab is not a deferred unique constraint")
	}
	if got := f.pgNotNull(t, db, "t"); got != "id,email,a,note,updated_at" {
		t.Fatalf("NOT NULL columns after MODIFY %s", got)
	}
	// The source drops an index while a user index on the target stays.
	if _, err := f.pg.Exec(f.ctx, `CREATE INDEX mine ON "`+db+`".t (a)`); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "DROP INDEX k_note ON t", "INSERT INTO t VALUES (1001, 'n2@x', 2, 1001, 'y', 'n', '2026-02-02')")
	f.waitCaughtUp(t, db, d)
	if got := keys(f.pgIndexes(t, db, "t")); got != "mine,t_k_ab,t_k_body,t_uq_ab,t_uq_email" {
		t.Fatalf("target indexes after DROP INDEX %s", got)
	}
	f.stopOK(t, d)

	if out, code := f.runPlan(t, cfg); code != 0 || !strings.Contains(out, db+".t: up to date") {
		t.Fatalf("plan after replication should find nothing to do: exit %d\n%s", code, out)
	}
}

// TestMirrorNotNullViolationQuarantines: a non-strict ALTER … NOT NULL
// turns NULLs into 0 on the source without a row event; the target still
// holds the NULLs. Following the NOT NULL fails: the table is quarantined
// with a message naming the column (the other table goes on), and a resync
// reloads it, NOT NULL included.
func TestMirrorNotNullViolationQuarantines(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_mirnn_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, v INT)",
		"CREATE TABLE other (id INT PRIMARY KEY, v INT)",
		"INSERT INTO t SELECT seq, IF(seq % 2, NULL, seq) FROM seq_1_to_10",
		"INSERT INTO other VALUES (1, 1)")
	cfg := f.configYAML(t, db, db, db, "UTC", start)
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	f.waitCaughtUp(t, db, d)
	f.exec(t, "SET SESSION sql_mode = ''", "ALTER TABLE t MODIFY v INT NOT NULL", "SET SESSION sql_mode = DEFAULT",
		"INSERT INTO t VALUES (11, 11)", "INSERT INTO other VALUES (2, 2)")
	f.waitCaughtUp(t, db, d)
	mode, reason := f.tableState(t, db, db, "t")
	if mode != "quarantined" || !strings.Contains(reason, `column "v" holds NULL in the target where the source declares NOT NULL`) {
		t.Fatalf("t: state %q reason %q\n%s", mode, reason, grepLines(d.stderr.String(), "quarantine"))
	}
	f.compareTable(t, db, "other")
	if outp, code := f.runResync(t, cfg, db+".t"); code != 0 {
		t.Fatalf("resync: exit %d\n%s", code, outp)
	}
	f.exec(t, "INSERT INTO t VALUES (12, 12)")
	f.waitCaughtUp(t, db, d)
	f.compareTable(t, db, "t")
	if got := f.pgNotNull(t, db, "t"); got != "id,v" {
		t.Fatalf("NOT NULL after resync: %s", got)
	}
	f.stopOK(t, d)
}
