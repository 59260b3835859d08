package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// Metadata columns of every target table. Source columns may not use the
// "_tm_" prefix.
const (
	colSeq         = "_tm_seq"         // Version.Seq: bigint not null
	colIdx         = "_tm_idx"         // Version.Index: integer not null
	colCommitTime  = "_tm_commit_time" // source commit time: timestamptz
	colLoadedAt    = "_tm_loaded_at"   // PostgreSQL's now() at insert and update
	colDeleted     = "_tm_deleted"     // soft delete mode: boolean not null default false
	colDeletedAt   = "_tm_deleted_at"  // soft delete mode: source commit time of the delete
	colOp          = "_tm_op"          // staging only: 'u' upsert, 'd' delete, 'k' old key of a key change
	reservedPrefix = "_tm_"
)

// Staged operation codes (the _tm_op column of a staging table).
const (
	opUpsert = "u" // insert, update or read: counted as inserted/updated/skipped
	opDelete = "d" // delete: counted as deleted/skipped
	// opKeyGone removes the old key of an update that changed the key. It
	// is not counted: the change it comes from is counted by its upsert.
	opKeyGone = "k"
	// opMarkDeleted is a soft delete that knows only the key
	// (tidemark.Change.KeyOnly): the row is marked deleted and keeps its
	// last values. Counted as deleted/skipped.
	opMarkDeleted = "x"
)

// tableDef is everything the sink derives from one source table schema
// (Table.ID + Table.Fingerprint): names, types and SQL text. It is built
// without touching the database and is immutable.
type tableDef struct {
	id      tidemark.TableID
	table   *tidemark.Table
	schema  string // target schema, unquoted
	name    string // target table, unquoted
	display string // schema.name for messages
	qname   string // "schema"."name"
	stage   string // staging table name, unquoted (in pg_temp)
	types   []string
	keySet  []bool
	notNull []bool // NOT NULL in the target: key columns, and the source's NOT NULL (mirrored)
	soft    bool

	createTableSQL string
	// createKeylessSQL is createTableSQL without the primary key (a
	// fresh load's table, keyafter.go).
	createKeylessSQL string
	createStageSQL   string
	upsertSQL        string // hard: op 'u'; soft: ops 'u' and 'd'
	upsertTombSQL    string // hard only: upsertSQL that loses to a newer tombstone and to the table's horizon ($1 the target)
	refreshSQL       string // upsertSQL for tidemark.Batch.Refresh: unchanged snapshot rows take their version
	refreshTombSQL   string // upsertTombSQL for tidemark.Batch.Refresh
	keyGoneSQL       string // soft only: op 'k'
	markSQL          string // soft only: op 'x'
	deleteSQL        string // hard only: ops 'd' and 'k'
	tomb             string // hard only: the quoted tombstone table
	horizons         string // hard only: the quoted tombstone horizons (tombstones.go)
	tombWriteSQL     string // hard only: tombstones of ops 'd' and 'k'
	keyLockSQL       string // hard only: locks the staged keys' stripes ($1 the target; tombstones.go)
	copyColumns      []string
	directColumns    []string // the direct insert path's COPY columns (direct.go)
	stageCopySQL     string   // binary COPY into the staging table (encode.go)
	directCopySQL    string   // binary COPY into the target table
}

// pgSystemColumns are the names of the system columns every PostgreSQL
// table has; a user column cannot have one (42701).
var pgSystemColumns = map[string]bool{"tableoid": true, "xmin": true, "cmin": true, "xmax": true, "cmax": true, "ctid": true}

// checkName validates a schema, table or column name as PostgreSQL stores
// it: a valid tidemark identifier of at most pgNameMax bytes. PostgreSQL
// truncates a longer name to its first 63 bytes without an error, so two
// long names (63 characters fit tidemark's rule, but a non-ASCII character
// takes 2 to 4 bytes) would become one table, or a column would read back
// under another name after a restart. Such a name is refused, not mapped.
func checkName(what, name string) error {
	if err := tidemark.CheckIdentifier(what, name); err != nil {
		return err
	}
	if len(name) > pgNameMax {
		return fmt.Errorf("%w: %s %q is %d bytes; PostgreSQL keeps only the first %d bytes of a name (two long names could become one): use a shorter name", tidemark.ErrInvalidIdentifier, what, name, len(name), pgNameMax)
	}
	return nil
}

// checkColumnName is checkName for a column, which may also not take a
// PostgreSQL system column name or tidemark's reserved prefix.
func checkColumnName(name string) error {
	if err := checkName("column", name); err != nil {
		return err
	}
	if pgSystemColumns[name] {
		return fmt.Errorf("%w: column %q is the name of a PostgreSQL system column, which every PostgreSQL table has: rename it at the source, or leave it out (source.exclude_columns)", tidemark.ErrInvalidIdentifier, name)
	}
	if strings.HasPrefix(strings.ToLower(name), reservedPrefix) {
		return fmt.Errorf("%w: column %q: names starting with %q are reserved for tidemark's metadata columns", tidemark.ErrInvalidIdentifier, name, reservedPrefix)
	}
	return nil
}

// CheckNames checks that PostgreSQL can hold the names of t as they are
// (checkName, checkColumnName), under targetSchema (the source database's
// name when empty). A name it cannot is a *tidemark.TableError naming the
// table and the identifier: the table is quarantined. The scale-out
// tailer checks the appliers' tables with it before it publishes them.
func CheckNames(t *tidemark.Table, targetSchema string) error {
	if targetSchema == "" {
		targetSchema = t.ID.Database
	}
	err := checkName("schema", targetSchema)
	if err == nil {
		err = checkName("table", t.ID.Name)
	}
	for i := 0; err == nil && i < len(t.Columns); i++ {
		err = checkColumnName(t.Columns[i].Name)
	}
	if err != nil {
		return &tidemark.TableError{Table: t.ID, Err: fmt.Errorf("map table %s to PostgreSQL: %w", t.ID, err)}
	}
	return nil
}

// newTableDef validates t and builds its definition. With mirrorNotNull,
// the source's NOT NULL columns are NOT NULL in the target too, in delete
// mode hard only: a soft-delete tombstone may hold NULL where the source
// never does (a key-diff tombstone carries its key alone).
func newTableDef(t *tidemark.Table, targetSchema string, mode DeleteMode, mirrorNotNull bool, tomb, horizons string) (*tableDef, error) {
	d := &tableDef{id: t.ID, table: t, schema: targetSchema, name: t.ID.Name, soft: mode == DeleteSoft, tomb: tomb, horizons: horizons}
	if d.schema == "" {
		d.schema = t.ID.Database
	}
	// A table PostgreSQL cannot hold as it is is this table's problem
	// only: a *tidemark.TableError, which quarantines it (the other tables
	// go on).
	fail := func(err error) (*tableDef, error) {
		return nil, &tidemark.TableError{Table: t.ID, Err: fmt.Errorf("map table %s to PostgreSQL: %w", t.ID, err)}
	}
	failf := func(format string, args ...any) (*tableDef, error) {
		return fail(fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), tidemark.ErrIncompatibleSchema))
	}
	if err := CheckNames(t, targetSchema); err != nil {
		return nil, err
	}
	if len(t.Columns) == 0 {
		return failf("no columns")
	}
	if len(t.Key) == 0 {
		return failf("no business key (a primary key or a configured key is required for upserts)")
	}
	d.display = d.schema + "." + d.name
	d.qname = tidemark.QuotePostgres(d.schema) + "." + tidemark.QuotePostgres(d.name)
	sum := sha256.Sum256([]byte(d.schema + "\x00" + d.name + "\x00" + t.Fingerprint()))
	d.stage = "_tm_stage_" + hex.EncodeToString(sum[:8])

	seen := map[string]bool{}
	d.types = make([]string, len(t.Columns))
	for i := range t.Columns {
		c := &t.Columns[i]
		if seen[c.Name] {
			return failf("column %q appears twice", c.Name)
		}
		seen[c.Name] = true
		typ, err := pgType(c)
		if err != nil {
			return failf("column %q: %v", c.Name, err)
		}
		d.types[i] = typ
	}
	d.keySet = make([]bool, len(t.Columns))
	for _, k := range t.Key {
		if k < 0 || k >= len(t.Columns) {
			return failf("key column index %d out of range", k)
		}
		if d.keySet[k] {
			return failf("key column %q appears twice", t.Columns[k].Name)
		}
		d.keySet[k] = true
	}
	d.notNull = make([]bool, len(t.Columns))
	for i := range t.Columns {
		d.notNull[i] = d.keySet[i] || (mirrorNotNull && !d.soft && !t.Columns[i].Nullable)
	}
	d.buildSQL()
	return d, nil
}

func (d *tableDef) buildSQL() {
	t := d.table
	cols := make([]string, len(t.Columns)) // quoted
	for i := range t.Columns {
		cols[i] = tidemark.QuotePostgres(t.Columns[i].Name)
	}
	keys := make([]string, len(t.Key))
	for i, k := range t.Key {
		keys[i] = cols[k]
	}
	q := tidemark.QuotePostgres

	// Target table. Key columns are NOT NULL, and so are the source's NOT
	// NULL columns when they are mirrored (d.notNull). Secondary indexes
	// come after the first load (indexes.go).
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE IF NOT EXISTS %s (\n", d.qname)
	for i := range t.Columns {
		fmt.Fprintf(&b, "\t%s %s", cols[i], d.types[i])
		if d.notNull[i] {
			b.WriteString(" NOT NULL")
		}
		b.WriteString(",\n")
	}
	fmt.Fprintf(&b, "\t%s bigint NOT NULL,\n\t%s integer NOT NULL,\n\t%s timestamptz,\n\t%s timestamptz NOT NULL DEFAULT now(),\n",
		q(colSeq), q(colIdx), q(colCommitTime), q(colLoadedAt))
	if d.soft {
		fmt.Fprintf(&b, "\t%s boolean NOT NULL DEFAULT false,\n\t%s timestamptz,\n", q(colDeleted), q(colDeletedAt))
	}
	body := b.String()
	d.createTableSQL = body + fmt.Sprintf("\tPRIMARY KEY (%s)\n)", strings.Join(keys, ", "))
	// A fresh load's table: the same without the primary key, built
	// after the load (keyafter.go).
	d.createKeylessSQL = strings.TrimSuffix(body, ",\n") + "\n)"

	// Staging table: a session temp table, emptied at every commit. Same
	// types as the target so COPY reports a bad value with its column.
	b.Reset()
	fmt.Fprintf(&b, "CREATE TEMP TABLE IF NOT EXISTS %s (%s text", q(d.stage), q(colOp))
	for i := range t.Columns {
		fmt.Fprintf(&b, ", %s %s", cols[i], d.types[i])
	}
	fmt.Fprintf(&b, ", %s bigint, %s integer, %s timestamptz) ON COMMIT DELETE ROWS", q(colSeq), q(colIdx), q(colCommitTime))
	d.createStageSQL = b.String()

	d.copyColumns = make([]string, 0, len(t.Columns)+4)
	d.copyColumns = append(d.copyColumns, colOp)
	for i := range t.Columns {
		d.copyColumns = append(d.copyColumns, t.Columns[i].Name)
	}
	d.copyColumns = append(d.copyColumns, colSeq, colIdx, colCommitTime)
	d.directColumns = append(append([]string{}, d.copyColumns[1:]...), colLoadedAt)
	if d.soft {
		d.directColumns = append(d.directColumns, colDeleted, colDeletedAt)
	}
	d.stageCopySQL = copySQL("pg_temp."+tidemark.QuotePostgres(d.stage), d.copyColumns)
	d.directCopySQL = copySQL(d.qname, d.directColumns)

	stage := "pg_temp." + q(d.stage)
	// The version guard: a staged row replaces the target row only if it is
	// strictly newer, so a replay or an older change is a no-op (Skipped).
	// One exception: a row read (Version.Index 0) over a row read at the
	// same version. Both were read at one capture (a first run or catch-up
	// resumed after a restart reads again at its recorded capture), and the
	// later read saw the source no earlier than the first, possibly in a
	// newer layout: an ADD COLUMN … NOT NULL between the two reads leaves
	// the new column NULL in every row the strict guard skips, and the
	// table is quarantined for it (nemesis seed 16). The read guard below
	// still makes an unchanged re-read a no-op.
	guard := fmt.Sprintf("((t.%[1]s, t.%[2]s) < (EXCLUDED.%[1]s, EXCLUDED.%[2]s) OR (EXCLUDED.%[2]s = 0 AND t.%[2]s = 0 AND t.%[1]s = EXCLUDED.%[1]s))", q(colSeq), q(colIdx))

	upsert := func(opFilter string, refresh bool) string {
		var b strings.Builder
		insertCols := append(append([]string{}, cols...), q(colSeq), q(colIdx), q(colCommitTime), q(colLoadedAt))
		sel := make([]string, 0, len(cols)+6)
		for _, c := range cols {
			sel = append(sel, "s."+c)
		}
		sel = append(sel, "s."+q(colSeq), "s."+q(colIdx), "s."+q(colCommitTime), "now()")
		if d.soft {
			insertCols = append(insertCols, q(colDeleted), q(colDeletedAt))
			sel = append(sel,
				fmt.Sprintf("s.%s <> '%s'", q(colOp), opUpsert),
				fmt.Sprintf("CASE WHEN s.%s = '%s' THEN NULL ELSE COALESCE(s.%s, now()) END", q(colOp), opUpsert, q(colCommitTime)))
		}
		fmt.Fprintf(&b, "INSERT INTO %s AS t (%s)\nSELECT %s FROM %s AS s WHERE s.%s %s\n",
			d.qname, strings.Join(insertCols, ", "), strings.Join(sel, ", "), stage, q(colOp), opFilter)
		fmt.Fprintf(&b, "ON CONFLICT (%s) DO UPDATE SET ", strings.Join(keys, ", "))
		var set []string
		for i := range cols {
			if !d.keySet[i] {
				set = append(set, fmt.Sprintf("%s = EXCLUDED.%s", cols[i], cols[i]))
			}
		}
		for _, m := range []string{colSeq, colIdx, colCommitTime} {
			set = append(set, fmt.Sprintf("%s = EXCLUDED.%s", q(m), q(m)))
		}
		set = append(set, q(colLoadedAt)+" = now()")
		if d.soft {
			set = append(set, fmt.Sprintf("%s = EXCLUDED.%s", q(colDeleted), q(colDeleted)),
				fmt.Sprintf("%s = EXCLUDED.%s", q(colDeletedAt), q(colDeletedAt)))
		}
		b.WriteString(strings.Join(set, ", "))
		// A row read by a snapshot or catch-up (Version.Index 0) that
		// finds the same values in the target changes nothing, not even
		// _tm_loaded_at: re-running a window (the incident's hourly
		// re-runs) is a no-op even after unrelated writes moved the
		// snapshot version. Binlog changes always apply when newer.
		var mine, theirs []string
		for i := range cols {
			if !d.keySet[i] {
				mine = append(mine, "t."+cols[i])
				theirs = append(theirs, "EXCLUDED."+cols[i])
			}
		}
		if d.soft {
			mine = append(mine, "t."+q(colDeleted))
			theirs = append(theirs, "EXCLUDED."+q(colDeleted))
		}
		readGuard := ""
		switch {
		case refresh:
			// Batch.Refresh: an unchanged snapshot row takes its version.
		case len(mine) > 0:
			readGuard = fmt.Sprintf(" AND (EXCLUDED.%s <> 0 OR (%s) IS DISTINCT FROM (%s))", q(colIdx), strings.Join(mine, ", "), strings.Join(theirs, ", "))
		default:
			readGuard = fmt.Sprintf(" AND EXCLUDED.%s <> 0", q(colIdx))
		}
		// A snapshot's version is above every change its read saw
		// (tidemark.Snapshot), so the plain guard also lets a snapshot
		// row replace them, and never a change the read did not see.
		fmt.Fprintf(&b, "\nWHERE %s%s\nRETURNING (t.xmax = 0)", guard, readGuard)
		if d.soft {
			fmt.Fprintf(&b, ", t.%s", q(colDeleted))
		}
		return b.String()
	}
	if d.soft {
		d.upsertSQL = upsert(fmt.Sprintf("IN ('%s', '%s')", opUpsert, opDelete), false)
		d.refreshSQL = upsert(fmt.Sprintf("IN ('%s', '%s')", opUpsert, opDelete), true)
		d.keyGoneSQL = upsert(fmt.Sprintf("= '%s'", opKeyGone), false)
		// A key-only delete marks the row it finds and leaves its values
		// alone; no row (or one already deleted) is a skip.
		var conds []string
		for _, k := range keys {
			conds = append(conds, fmt.Sprintf("t.%s = s.%s", k, k))
		}
		d.markSQL = fmt.Sprintf("UPDATE %s AS t SET %s = true, %s = COALESCE(s.%s, now()), %s = s.%s, %s = s.%s, %s = s.%s, %s = now()\n"+
			"FROM %s AS s\nWHERE s.%s = '%s' AND %s\n  AND (t.%s, t.%s) < (s.%s, s.%s) AND NOT t.%s\nRETURNING 1",
			d.qname, q(colDeleted), q(colDeletedAt), q(colCommitTime), q(colSeq), q(colSeq), q(colIdx), q(colIdx), q(colCommitTime), q(colCommitTime), q(colLoadedAt),
			stage, q(colOp), opMarkDeleted, strings.Join(conds, " AND "),
			q(colSeq), q(colIdx), q(colSeq), q(colIdx), q(colDeleted))
	} else {
		// Hard delete, guarded like the upsert. The deleted row's version
		// is kept in a tombstone (tombstones.go) that an older upsert
		// loses to, so a replay from an older checkpoint cannot bring the
		// row back.
		guard, horizon, write := "", "", ""
		if d.tomb != "" {
			guard, write, d.keyLockSQL = tombstoneSQL(d.tomb, stage, t)
			horizon = horizonSQL(d.horizons, d.qname, keys)
		}
		d.upsertSQL = upsert(fmt.Sprintf("= '%s'", opUpsert), false)
		d.refreshSQL = upsert(fmt.Sprintf("= '%s'", opUpsert), true)
		if guard != "" {
			d.upsertTombSQL = upsert(fmt.Sprintf("= '%s'%s%s", opUpsert, guard, horizon), false)
			d.refreshTombSQL = upsert(fmt.Sprintf("= '%s'%s%s", opUpsert, guard, horizon), true)
		}
		d.tombWriteSQL = write
		var conds []string
		for _, k := range keys {
			conds = append(conds, fmt.Sprintf("t.%s = s.%s", k, k))
		}
		d.deleteSQL = fmt.Sprintf("DELETE FROM %s AS t USING %s AS s\nWHERE s.%s IN ('%s', '%s') AND %s\n  AND (t.%s, t.%s) < (s.%s, s.%s)\nRETURNING s.%s",
			d.qname, stage, q(colOp), opDelete, opKeyGone, strings.Join(conds, " AND "),
			q(colSeq), q(colIdx), q(colSeq), q(colIdx), q(colOp))
	}
}

// createWith creates the target schema (if missing) and table, with the
// statement create (createTableSQL, or createKeylessSQL for a fresh
// load's table), in tx, which holds the DDL lock (CREATE SCHEMA/TABLE IF
// NOT EXISTS race into unique violations between sessions). It runs in
// its own short transaction before the batch's: an empty table left
// behind by a batch that then fails is harmless.
func (d *tableDef) createWith(ctx context.Context, tx pgx.Tx, create string) error {
	// Check before CREATE ... IF NOT EXISTS: those need the CREATE
	// privilege even when the object exists.
	var schemaExists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", d.schema).Scan(&schemaExists); err != nil {
		return d.wrap("look up schema of table", err)
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+tidemark.QuotePostgres(d.schema)); err != nil {
			return d.wrap("create schema of table", err)
		}
	}
	if _, err := tx.Exec(ctx, create); err != nil {
		return d.wrap("create table", err)
	}
	return nil
}

// wrap annotates a database error with the table and, when PostgreSQL names
// one, the column.
func (d *tableDef) wrap(what string, err error) error {
	if col := errColumn(err, d.table); col != "" {
		return fmt.Errorf("%s %s (column %q): %w", what, d.display, col, err)
	}
	return fmt.Errorf("%s %s: %w", what, d.display, err)
}
