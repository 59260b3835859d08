package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// Schema evolution (docs/schema-changes.md).
//
// Every target table carries, as its table comment, the source schema it is
// aligned to (the "alignment": columns with kind and widths, the business
// key, and the columns kept after the source dropped them). When rows arrive
// with a new schema (a new Table.Fingerprint) the sink compares the new
// source schema with the alignment and the target's catalog, in its own
// transaction under the DDL lock, before the data transaction:
//
//   - a new column is added (nullable, with the type mapping);
//   - a widened column (a wider integer, DECIMAL with no fewer integer or
//     fraction digits, FLOAT → DOUBLE, a longer BIT, more fractional
//     seconds, ENUM/SET → text) gets the wider PostgreSQL type
//     (ALTER COLUMN … TYPE) when its mapping changes;
//   - a column the source dropped is kept (default: it holds the values it
//     had, and NULL in rows inserted later) or dropped (drop_columns: drop);
//   - anything else — a narrowed type, a changed sign, a change of kind, a
//     new business key — cannot be followed without losing or misaligning
//     data (an ALTER TABLE rewrites existing rows without logging them) and
//     is a *tidemark.TableError wrapping tidemark.ErrIncompatibleSchema: the
//     pipeline quarantines the table.
//
// Renames cannot be seen in a row schema: the source's ALTER TABLE event
// (ApplyDDL) renames the target column, which keeps its data.

// Policies of SchemaPolicy.
const (
	KeepColumns = "keep"
	DropColumns = "drop"
	ApplyDDL    = "apply"
	RefuseDDL   = "refuse"
)

// SchemaPolicy says how the sink follows the source's schema changes.
type SchemaPolicy struct {
	// DropColumns is "keep" (default: a column the source dropped stays in
	// the target, with its values, and is no longer written) or "drop".
	DropColumns string
	// DropTable is "refuse" (default: a DROP TABLE of the source
	// quarantines the table and the target keeps it) or "apply" (the
	// target table is dropped).
	DropTable string
	// Truncate is "apply" (default: the target table is truncated, in
	// order with the row changes) or "refuse" (quarantine).
	Truncate string
	// KeepNullable leaves the columns of an existing target table
	// nullable where the source declares NOT NULL (a table the sink
	// creates still mirrors it). The appliers of the scale-out topology
	// set it: their partitions apply a new layout at different times (a
	// lagging one still writes rows without the new column), and the rows
	// of a backfill follow the layout that needs them, so a NOT NULL
	// added to a table with rows would stop the applier.
	KeepNullable bool
}

func (p SchemaPolicy) withDefaults() SchemaPolicy {
	if p.DropColumns == "" {
		p.DropColumns = KeepColumns
	}
	if p.DropTable == "" {
		p.DropTable = RefuseDDL
	}
	if p.Truncate == "" {
		p.Truncate = ApplyDDL
	}
	return p
}

// Validate checks the policy (empty fields take their defaults). Errors
// name the field: drop_columns, ddl.drop_table, ddl.truncate.
func (p SchemaPolicy) Validate() error {
	p = p.withDefaults()
	var errs []error
	if p.DropColumns != KeepColumns && p.DropColumns != DropColumns {
		errs = append(errs, fmt.Errorf("drop_columns: must be %q or %q, got %q", KeepColumns, DropColumns, p.DropColumns))
	}
	if p.DropTable != ApplyDDL && p.DropTable != RefuseDDL {
		errs = append(errs, fmt.Errorf("ddl.drop_table: must be %q or %q, got %q", ApplyDDL, RefuseDDL, p.DropTable))
	}
	if p.Truncate != ApplyDDL && p.Truncate != RefuseDDL {
		errs = append(errs, fmt.Errorf("ddl.truncate: must be %q or %q, got %q", ApplyDDL, RefuseDDL, p.Truncate))
	}
	return errors.Join(errs...)
}

// alignment is the source schema a target table is aligned to, stored as
// the table's comment.
type alignment struct {
	Format  int             `json:"tidemark_alignment"`
	Columns []alignedColumn `json:"columns"`
	Key     []string        `json:"key"`
	// Kept lists target columns that the source dropped (drop_columns:
	// keep).
	Kept []string `json:"kept,omitempty"`
	// Indexes maps the name of each index or constraint the sink created
	// to mirror a source index to the statement that created it
	// (indexes.go). Others on the table are never touched.
	Indexes map[string]string `json:"indexes,omitempty"`
	// Seq and Idx are the version of the layout (tidemark.Table.Since)
	// when it was known: an older layout never realigns the table
	// (older.go).
	Seq uint64 `json:"seq,omitempty"`
	Idx uint32 `json:"idx,omitempty"`
}

// since returns the version of the layout the table is aligned to (zero:
// unknown).
func (a *alignment) since() tidemark.Version { return tidemark.Version{Seq: a.Seq, Index: a.Idx} }

type alignedColumn struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Bits      int    `json:"bits,omitempty"`
	Precision int    `json:"precision,omitempty"`
	Scale     int    `json:"scale,omitempty"`
}

var kindByName = func() map[string]tidemark.Kind {
	m := map[string]tidemark.Kind{}
	for k := tidemark.KindInt; k <= tidemark.KindSet; k++ {
		m[k.String()] = k
	}
	return m
}()

func alignmentOf(t *tidemark.Table) *alignment {
	a := &alignment{Format: 1, Key: t.KeyNames(), Seq: t.Since.Seq, Idx: t.Since.Index}
	for _, c := range t.Columns {
		a.Columns = append(a.Columns, alignedColumn{Name: c.Name, Kind: c.Kind.String(), Bits: c.Bits, Precision: c.Precision, Scale: c.Scale})
	}
	return a
}

func (a *alignment) column(name string) (tidemark.Column, bool) {
	for _, c := range a.Columns {
		if c.Name == name {
			return tidemark.Column{Name: c.Name, Kind: kindByName[c.Kind], Bits: c.Bits, Precision: c.Precision, Scale: c.Scale}, true
		}
	}
	return tidemark.Column{}, false
}

// targetTable is what the catalog says about a target table.
type targetTable struct {
	exists  bool
	types   map[string]string // column → canonical PostgreSQL type
	notNull map[string]bool   // column → NOT NULL
	key     []string          // primary key columns, in order
	align   *alignment        // nil: no (readable) alignment comment
}

// readTarget reads a target table's columns, primary key and alignment.
func readTarget(ctx context.Context, tx pgx.Tx, qname string) (*targetTable, error) {
	t := &targetTable{types: map[string]string{}, notNull: map[string]bool{}}
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&t.exists); err != nil {
		return nil, err
	}
	if !t.exists {
		return t, nil
	}
	rows, err := tx.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, qname)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, typ string
		var notNull bool
		if err := rows.Scan(&name, &typ, &notNull); err != nil {
			rows.Close()
			return nil, err
		}
		t.types[name] = canonType(typ)
		t.notNull[name] = notNull
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, `SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)`, qname)
	if err != nil {
		return nil, err
	}
	if t.key, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return nil, err
	}
	var comment *string
	if err := tx.QueryRow(ctx, "SELECT obj_description($1::regclass, 'pg_class')", qname).Scan(&comment); err != nil {
		return nil, err
	}
	if comment != nil {
		var a alignment
		if json.Unmarshal([]byte(*comment), &a) == nil && a.Format == 1 {
			t.align = &a
		}
	}
	return t, nil
}

// setAlignment stores a as the table's comment. COMMENT takes no bind
// parameters, so the text and the table go through transaction-local
// settings (bind parameters) into a constant statement that formats them
// with %L and regclass.
func setAlignment(ctx context.Context, tx pgx.Tx, qname string, a *alignment) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('tidemark.align_table', $1, true), set_config('tidemark.align_text', $2, true)", qname, string(b)); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `DO $$ BEGIN
EXECUTE format('COMMENT ON TABLE %s IS %L', current_setting('tidemark.align_table')::regclass, current_setting('tidemark.align_text'));
END $$`)
	return err
}

// canonType turns format_type output and pgType output into one form.
func canonType(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	switch s {
	case "timestamptz":
		return "timestamp with time zone"
	case "int2":
		return "smallint"
	case "int4", "int":
		return "integer"
	case "int8":
		return "bigint"
	case "float4":
		return "real"
	case "float8":
		return "double precision"
	}
	return strings.ReplaceAll(s, ", ", ",")
}

var numericRE = regexp.MustCompile(`^numeric\((\d+),(\d+)\)$`)
var bitRE = regexp.MustCompile(`^bit\((\d+)\)$`)

// pgFits reports whether every value of PostgreSQL type from converts to
// type to without loss by an implicit (assignment) cast, so that rows
// staged as from can be written into a column of type to.
func pgFits(from, to string) bool {
	if from == to {
		return true
	}
	rank := map[string]int{"smallint": 1, "integer": 2, "bigint": 3}
	if rf, ok := rank[from]; ok {
		if rt, ok := rank[to]; ok {
			return rf <= rt
		}
		if to == "numeric" {
			return true
		}
		if m := numericRE.FindStringSubmatch(to); m != nil {
			p, _ := strconv.Atoi(m[1])
			s, _ := strconv.Atoi(m[2])
			digits := map[string]int{"smallint": 5, "integer": 10, "bigint": 19}[from]
			return p-s >= digits
		}
		return false
	}
	if from == "real" {
		return to == "double precision"
	}
	if mf := numericRE.FindStringSubmatch(from); mf != nil {
		if to == "numeric" {
			return true
		}
		if mt := numericRE.FindStringSubmatch(to); mt != nil {
			pf, _ := strconv.Atoi(mf[1])
			sf, _ := strconv.Atoi(mf[2])
			pt, _ := strconv.Atoi(mt[1])
			st, _ := strconv.Atoi(mt[2])
			return pt-st >= pf-sf && st >= sf
		}
	}
	return false
}

// describe names a column's type for messages.
func describe(c tidemark.Column) string {
	switch c.Kind {
	case tidemark.KindInt, tidemark.KindUint, tidemark.KindBit:
		return fmt.Sprintf("%s(%d bits)", c.Kind, c.Bits)
	case tidemark.KindDecimal:
		return fmt.Sprintf("decimal(%d,%d)", c.Precision, c.Scale)
	case tidemark.KindTime, tidemark.KindDateTime, tidemark.KindTimestamp:
		return fmt.Sprintf("%s(%d)", c.Kind, c.Scale)
	}
	return c.Kind.String()
}

// change classes of one column.
const (
	colSame = iota
	colWiden
	colIncompatible
)

// classify compares a column's old and new source types: the same (as far
// as the target is concerned), a widening (every old value is unchanged in
// the new type, so rows the ALTER rewrote in place still equal the target),
// or incompatible.
func classify(o, n tidemark.Column) int {
	if o.Kind == n.Kind && o.Bits == n.Bits && o.Precision == n.Precision && o.Scale == n.Scale {
		return colSame
	}
	widerIf := func(ok bool) int {
		if ok {
			return colWiden
		}
		return colIncompatible
	}
	bits := func(b int) int {
		if b == 0 {
			return 64
		}
		return b
	}
	switch {
	case o.Kind == n.Kind:
		switch o.Kind {
		case tidemark.KindInt, tidemark.KindUint, tidemark.KindBit:
			return widerIf(bits(n.Bits) >= bits(o.Bits))
		case tidemark.KindDecimal:
			if n.Precision == 0 && n.Scale == 0 {
				return colWiden // unconstrained numeric holds everything
			}
			if o.Precision == 0 && o.Scale == 0 {
				return colIncompatible
			}
			return widerIf(n.Precision-n.Scale >= o.Precision-o.Scale && n.Scale >= o.Scale)
		case tidemark.KindTime, tidemark.KindDateTime, tidemark.KindTimestamp:
			// Fewer fractional digits round the existing values.
			return widerIf(n.Scale >= o.Scale)
		}
		return colSame
	case o.Kind == tidemark.KindUint && n.Kind == tidemark.KindInt:
		return widerIf(bits(n.Bits) > bits(o.Bits))
	case o.Kind == tidemark.KindFloat && n.Kind == tidemark.KindDouble:
		return colWiden
	case (o.Kind == tidemark.KindEnum || o.Kind == tidemark.KindSet) && n.Kind == tidemark.KindText:
		return colWiden // the member names are the text
	}
	return colIncompatible
}

// evolution is the DDL that aligns a target table with a new source schema.
type evolution struct {
	stmts []string
	align *alignment
}

// incompatible builds the TableError that quarantines the table.
func (d *tableDef) incompatible(format string, args ...any) error {
	return &tidemark.TableError{Table: d.id, Err: fmt.Errorf("target %s: %s: %w", d.display, fmt.Sprintf(format, args...), tidemark.ErrIncompatibleSchema)}
}

// evolve computes the DDL that takes the existing target table t to d's
// source schema under policy.
func (d *tableDef) evolve(t *targetTable, policy SchemaPolicy) (*evolution, error) {
	ev := &evolution{align: alignmentOf(d.table)}
	q := tidemark.QuotePostgres
	alter := func(format string, args ...any) {
		ev.stmts = append(ev.stmts, "ALTER TABLE "+d.qname+" "+fmt.Sprintf(format, args...))
	}
	old := t.align
	// The business key.
	oldKey := t.key
	if old != nil {
		oldKey = old.Key
		ev.align.Kept = slices.Clone(old.Kept)
		ev.align.Indexes = old.Indexes
		if d.table.Since == (tidemark.Version{}) {
			ev.align.Seq, ev.align.Idx = old.Seq, old.Idx
		}
	}
	if newKey := d.table.KeyNames(); !slices.Equal(oldKey, newKey) {
		return nil, d.incompatible("business key changed from (%s) to (%s)", strings.Join(oldKey, ", "), strings.Join(newKey, ", "))
	}
	present := map[string]bool{}
	added := map[string]bool{} // columns added (nullable) by this evolution
	for i := range d.table.Columns {
		n := d.table.Columns[i]
		present[n.Name] = true
		want := canonType(d.types[i])
		have, inTarget := t.types[n.Name]
		var o tidemark.Column
		var known bool
		if old != nil {
			o, known = old.column(n.Name)
		}
		kept := slices.Contains(ev.align.Kept, n.Name)
		switch {
		case known:
			cls := classify(o, n)
			if cls == colIncompatible {
				return nil, d.incompatible("column %q: %s → %s cannot be followed losslessly", n.Name, describe(o), describe(n))
			}
			switch {
			case !inTarget:
				alter("ADD COLUMN %s %s", q(n.Name), d.types[i])
				added[n.Name] = true
			case have != want && cls == colWiden:
				alter("ALTER COLUMN %s TYPE %s%s", q(n.Name), d.types[i], usingFor(n.Name, have, want))
			}
		case inTarget && kept:
			// A column the source dropped and now adds again: the kept
			// values are stale (ApplyDDL normally drops the column when
			// the ADD is seen). Start over with NULLs, like the source.
			alter("DROP COLUMN %s", q(n.Name))
			alter("ADD COLUMN %s %s", q(n.Name), d.types[i])
			added[n.Name] = true
			ev.align.Kept = slices.DeleteFunc(ev.align.Kept, func(s string) bool { return s == n.Name })
		case inTarget:
			// No alignment for this column (a table from before
			// alignments, or one made by hand): compare the types.
			switch {
			case have == want || pgFits(want, have):
			case pgFits(have, want):
				alter("ALTER COLUMN %s TYPE %s%s", q(n.Name), d.types[i], usingFor(n.Name, have, want))
			default:
				return nil, d.incompatible("column %q: target type %s cannot hold source %s", n.Name, have, describe(n))
			}
		default:
			alter("ADD COLUMN %s %s", q(n.Name), d.types[i])
			added[n.Name] = true
		}
	}
	// Columns the source no longer has.
	gone := func(name string) {
		if strings.HasPrefix(name, reservedPrefix) || slices.Contains(t.key, name) {
			return
		}
		if _, ok := t.types[name]; !ok {
			return
		}
		if policy.DropColumns == DropColumns {
			alter("DROP COLUMN %s", q(name))
			ev.align.Kept = slices.DeleteFunc(ev.align.Kept, func(s string) bool { return s == name })
		} else if !slices.Contains(ev.align.Kept, name) {
			ev.align.Kept = append(ev.align.Kept, name)
		}
	}
	if old != nil {
		for _, c := range old.Columns {
			if !present[c.Name] {
				gone(c.Name)
			}
		}
		if policy.DropColumns == DropColumns {
			for _, name := range slices.Clone(ev.align.Kept) {
				if !present[name] {
					gone(name)
				}
			}
		}
	} else {
		for name := range t.types {
			if !present[name] {
				gone(name)
			}
		}
	}
	slices.Sort(ev.align.Kept)
	// NOT NULL: the source's (mirrored, d.notNull), dropped where the
	// source dropped it; a kept column gets NULL in new rows.
	for i, c := range d.table.Columns {
		if want, have := d.notNull[i], t.notNull[c.Name] && !added[c.Name]; want != have && !d.keySet[i] {
			if want {
				if policy.KeepNullable {
					continue
				}
				alter("ALTER COLUMN %s SET NOT NULL", q(c.Name))
			} else {
				alter("ALTER COLUMN %s DROP NOT NULL", q(c.Name))
			}
		}
	}
	for _, name := range ev.align.Kept {
		if t.notNull[name] && !slices.Contains(t.key, name) {
			alter("ALTER COLUMN %s DROP NOT NULL", q(name))
		}
	}
	return ev, nil
}

// usingFor returns the USING clause of a type change that needs one: a BIT
// widening keeps the value (right-aligned), where a plain cast would pad on
// the right.
func usingFor(col, have, want string) string {
	if bitRE.MatchString(have) && bitRE.MatchString(want) {
		return fmt.Sprintf(" USING %s::bigint::%s", tidemark.QuotePostgres(col), want)
	}
	return ""
}

// ensureTx creates or evolves d's target table in tx (holding the DDL lock).
//
// directSafe is set when the direct insert path may be used: the target's
// primary key is the business key and is checked at once (not deferred), so
// a COPY of an existing key fails instead of adding a second row. proj is
// set when d is an older layout than the table's whose rows leave columns
// out (older.go).
func (s *Sink) ensureTx(ctx context.Context, tx pgx.Tx, d *tableDef, directSafe *bool, proj **projection) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", ddlLockKey); err != nil {
		return d.wrap("lock for DDL on table", err)
	}
	t, err := readTarget(ctx, tx, d.qname)
	if err != nil {
		return d.wrap("read the target schema of", err)
	}
	if !t.exists {
		if err := d.create(ctx, tx); err != nil {
			return err
		}
		if err := setAlignment(ctx, tx, d.qname, alignmentOf(d.table)); err != nil {
			return d.wrap("record the schema of", err)
		}
		*directSafe = true // created with the business key as primary key
		return s.ensureIndexes(ctx, tx, d)
	}
	for _, c := range []string{colSeq, colIdx, colCommitTime, colLoadedAt} {
		if _, ok := t.types[c]; !ok {
			return fmt.Errorf("check table %s: target table has no column %q (source table %s): it is not a tidemark table", d.display, c, d.id)
		}
	}
	if d.soft {
		for _, c := range []string{colDeleted, colDeletedAt} {
			if _, ok := t.types[c]; !ok {
				return fmt.Errorf("check table %s: target table has no column %q (source table %s): it was created for delete_mode hard", d.display, c, d.id)
			}
		}
	}
	if olderLayout(d, t) {
		p, err := s.fitOlder(ctx, tx, d, t)
		*proj = p
		return err
	}
	ev, err := d.evolve(t, s.cfg.Schema)
	if err != nil {
		return err
	}
	for _, stmt := range ev.stmts {
		s.log.Info("following a schema change of the source", "table", d.display, "source_table", d.id.String(), "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			if cerr := constraintFailed(d.id, d.display, err); cerr != nil {
				return cerr
			}
			return d.wrap("alter table", err)
		}
	}
	drops, err := deferredKeyConstraints(ctx, tx, d, t)
	if err != nil {
		return err
	}
	for _, sp := range drops {
		s.log.Info("dropping a deferrable constraint on the business key (the primary key enforces it; ON CONFLICT cannot use a deferrable arbiter)",
			"table", d.display, "source_table", d.id.String(), "constraint", sp.name, "ddl", sp.drop)
		if _, err := tx.Exec(ctx, sp.drop); err != nil {
			return d.wrap("alter table", err)
		}
	}
	if len(drops) > 0 {
		ev.align.Indexes = t.align.Indexes
	}
	if t.align == nil || len(ev.stmts) > 0 || len(drops) > 0 || !sameAlignment(t.align, ev.align) {
		if err := setAlignment(ctx, tx, d.qname, ev.align); err != nil {
			return d.wrap("record the schema of", err)
		}
	}
	if len(ev.stmts) > 0 {
		if t, err = readTarget(ctx, tx, d.qname); err != nil {
			return d.wrap("read the target schema of", err)
		}
	}
	if slices.Equal(t.key, d.table.KeyNames()) && directTypesMatch(t, d) {
		if err := tx.QueryRow(ctx, "SELECT COALESCE(bool_and(indimmediate), false) FROM pg_index WHERE indrelid = $1::regclass AND indisprimary",
			d.qname).Scan(directSafe); err != nil {
			return d.wrap("read the primary key of", err)
		}
	}
	return s.ensureIndexes(ctx, tx, d)
}

// ensureIndexes mirrors the indexes of a streamed table schema (one that
// knows them: a snapshot's does not, its indexes come after the load) in
// ensureTx's transaction. A table the stream creates is empty: its
// indexes are built at once.
func (s *Sink) ensureIndexes(ctx context.Context, tx pgx.Tx, d *tableDef) error {
	if !d.table.IndexesKnown || s.cfg.SkipIndexes {
		return nil
	}
	t, err := readTarget(ctx, tx, d.qname)
	if err != nil {
		return d.wrap("read the target schema of", err)
	}
	if t.align == nil {
		return nil
	}
	before := maps.Clone(t.align.Indexes)
	if _, err := s.mirrorTx(ctx, tx, d.id, d.qname, t, t.align, d.table.Indexes, false); err != nil {
		return err
	}
	if maps.Equal(before, t.align.Indexes) {
		return nil
	}
	if err := setAlignment(ctx, tx, d.qname, t.align); err != nil {
		return d.wrap("record the indexes of", err)
	}
	return nil
}

// directTypesMatch reports whether every column the direct insert path
// writes has exactly the type its binary COPY encodes (a target may hold a
// wider type, which staging reaches through an assignment cast).
func directTypesMatch(t *targetTable, d *tableDef) bool {
	for i := range d.table.Columns {
		if t.types[d.table.Columns[i].Name] != canonType(d.types[i]) {
			return false
		}
	}
	meta := map[string]string{colSeq: "bigint", colIdx: "integer", colCommitTime: "timestamptz", colLoadedAt: "timestamptz"}
	if d.soft {
		meta[colDeleted], meta[colDeletedAt] = "boolean", "timestamptz"
	}
	for c, typ := range meta {
		if t.types[c] != canonType(typ) {
			return false
		}
	}
	return true
}

func sameAlignment(a, b *alignment) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// targetOf maps a source table to its target schema, name and quoted name.
func (s *Sink) targetOf(id tidemark.TableID) (schema, name, qname string, err error) {
	schema = s.cfg.TargetSchema
	if schema == "" {
		schema = id.Database
	}
	if err := checkName("schema", schema); err != nil {
		return "", "", "", &tidemark.TableError{Table: id, Err: fmt.Errorf("map table %s to PostgreSQL: %w", id, err)}
	}
	if err := checkName("table", id.Name); err != nil {
		return "", "", "", &tidemark.TableError{Table: id, Err: fmt.Errorf("map table %s to PostgreSQL: %w", id, err)}
	}
	return schema, id.Name, tidemark.QuotePostgres(schema) + "." + tidemark.QuotePostgres(id.Name), nil
}

// forgetTable drops what the sink cached about a table's target.
func (s *Sink) forgetTable(id tidemark.TableID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.ensured {
		if k.id == id {
			delete(s.ensured, k)
		}
	}
	for k := range s.projections {
		if k.id == id {
			delete(s.projections, k)
		}
	}
}

var _ tidemark.DDLSink = (*Sink)(nil)

// ApplyDDL implements tidemark.DDLSink: the events and the checkpoint in one
// transaction, under the DDL lock.
//
//   - TRUNCATE truncates the target table (ddl.truncate: apply) or is
//     refused (a *tidemark.TableError wrapping tidemark.ErrDDLRefused).
//   - DROP TABLE drops the target table and forgets the table's state and
//     watermark (ddl.drop_table: apply), or is refused.
//   - ALTER TABLE renames target columns (their data stays), drops the
//     columns the source dropped (drop_columns: drop) or records them as
//     kept, and drops a kept column the source adds again (existing rows
//     have NULL there in the source). Types are followed when rows with
//     the new schema arrive.
//
// A TableError is never retried and nothing is committed; the pipeline
// quarantines the table and calls ApplyDDL again without it.
func (s *Sink) ApplyDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	touched := map[tidemark.TableID]bool{}
	err := tidemark.Retry(ctx, "apply DDL of source "+source, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		return redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", ddlLockKey); err != nil {
				return fmt.Errorf("lock for DDL: %w", err)
			}
			for _, ev := range events {
				touched[ev.Table] = true
				if err := s.applyEvent(ctx, tx, source, ev); err != nil {
					return err
				}
			}
			if !checkpoint.IsZero() {
				return s.cfg.Checkpoints.SavePosition(ctx, querier{tx}, source, checkpoint)
			}
			return nil
		}), s.secret)
	})
	for id := range touched {
		s.forgetTable(id)
	}
	if err != nil {
		return redact(err, s.secret)
	}
	return nil
}

func (s *Sink) applyEvent(ctx context.Context, tx pgx.Tx, source string, ev tidemark.DDLEvent) error {
	policy := s.cfg.Schema
	_, _, qname, err := s.targetOf(ev.Table)
	if err != nil {
		return err // a *tidemark.TableError
	}
	refused := func(stmt, key string) error {
		return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("%s refused by the configuration (ddl.%s: refuse); the target table %s is kept as it was: %w",
			stmt, key, qname, tidemark.ErrDDLRefused)}
	}
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
		return fmt.Errorf("look up %s: %w", qname, err)
	}
	switch ev.Op {
	case tidemark.DDLTruncate:
		if !exists {
			return nil // nothing to keep or to truncate
		}
		if policy.Truncate != ApplyDDL {
			return refused("TRUNCATE", "truncate")
		}
		s.log.Info("truncating target table (source TRUNCATE)", "table", qname, "source_table", ev.Table.String())
		if _, err := tx.Exec(ctx, "TRUNCATE "+qname); err != nil {
			return fmt.Errorf("truncate %s: %w", qname, err)
		}
	case tidemark.DDLDropTable:
		// Refused only when there is a target table to keep: a table
		// created and dropped before any row reached the target (a
		// staging table, say) is simply forgotten.
		if exists && policy.DropTable != ApplyDDL {
			stmt := "DROP TABLE"
			if ev.Reason != "" {
				stmt += " (" + ev.Reason + ")"
			}
			return refused(stmt, "drop_table")
		}
		if exists {
			s.log.Info("dropping target table (source DROP TABLE)", "table", qname, "source_table", ev.Table.String(), "reason", ev.Reason)
			if _, err := tx.Exec(ctx, "DROP TABLE "+qname); err != nil {
				return fmt.Errorf("drop %s: %w", qname, err)
			}
		}
		if store, ok := s.cfg.Checkpoints.(tidemark.TableStateStore); ok {
			if err := store.DeleteTableState(ctx, querier{tx}, source, ev.Table); err != nil {
				return err
			}
			if err := store.DeleteWatermark(ctx, querier{tx}, source, ev.Table); err != nil {
				return err
			}
		}
	case tidemark.DDLAlterTable:
		if !exists {
			return nil
		}
		return s.alterEvent(ctx, tx, qname, ev)
	}
	return nil
}

// alterEvent applies what an ALTER TABLE event shows and a row schema
// cannot: renames, drops and re-adds.
func (s *Sink) alterEvent(ctx context.Context, tx pgx.Tx, qname string, ev tidemark.DDLEvent) error {
	t, err := readTarget(ctx, tx, qname)
	if err != nil {
		return fmt.Errorf("read the target schema of %s: %w", qname, err)
	}
	if !t.exists {
		return nil
	}
	q := tidemark.QuotePostgres
	a := t.align
	var before []byte
	if a != nil {
		before, _ = json.Marshal(a)
	}
	exec := func(stmt string) error {
		s.log.Info("following a schema change of the source", "table", qname, "source_table", ev.Table.String(), "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("alter %s: %w", qname, err)
		}
		return nil
	}
	has := func(c string) bool { _, ok := t.types[c]; return ok }
	for _, r := range ev.Renames {
		if err := checkColumnName(r.To); err != nil {
			return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("rename column %q: %w", r.From, err)}
		}
		if !has(r.From) {
			continue // already renamed (a replay), or never written
		}
		if has(r.To) {
			if a == nil || !slices.Contains(a.Kept, r.To) {
				return &tidemark.TableError{Table: ev.Table, Err: fmt.Errorf("rename column %q to %q: the target %s already has a column %q: %w",
					r.From, r.To, qname, r.To, tidemark.ErrIncompatibleSchema)}
			}
			if err := exec("ALTER TABLE " + qname + " DROP COLUMN " + q(r.To)); err != nil {
				return err
			}
			a.Kept = slices.DeleteFunc(a.Kept, func(s string) bool { return s == r.To })
		}
		if err := exec("ALTER TABLE " + qname + " RENAME COLUMN " + q(r.From) + " TO " + q(r.To)); err != nil {
			return err
		}
		t.types[r.To] = t.types[r.From]
		delete(t.types, r.From)
		if a != nil {
			for i := range a.Columns {
				if a.Columns[i].Name == r.From {
					a.Columns[i].Name = r.To
				}
			}
			for i := range a.Key {
				if a.Key[i] == r.From {
					a.Key[i] = r.To
				}
			}
			for i := range a.Kept {
				if a.Kept[i] == r.From {
					a.Kept[i] = r.To
				}
			}
		}
	}
	for _, c := range ev.Dropped {
		if !has(c) || slices.Contains(t.key, c) {
			continue
		}
		if a != nil {
			a.Columns = slices.DeleteFunc(a.Columns, func(x alignedColumn) bool { return x.Name == c })
		}
		if s.cfg.Schema.DropColumns == DropColumns {
			if err := exec("ALTER TABLE " + qname + " DROP COLUMN " + q(c)); err != nil {
				return err
			}
			delete(t.types, c)
			if a != nil {
				a.Kept = slices.DeleteFunc(a.Kept, func(s string) bool { return s == c })
			}
		} else {
			if a != nil && !slices.Contains(a.Kept, c) {
				a.Kept = append(a.Kept, c)
			}
			if t.notNull[c] {
				// Rows inserted from now on have no value for it.
				if err := exec("ALTER TABLE " + qname + " ALTER COLUMN " + q(c) + " DROP NOT NULL"); err != nil {
					return err
				}
			}
		}
	}
	for _, c := range ev.Added {
		if !has(c) || a == nil || !slices.Contains(a.Kept, c) {
			continue
		}
		// A kept column added again: its old values are not the source's
		// (NULL, or a default the backfill brings).
		if err := exec("ALTER TABLE " + qname + " DROP COLUMN " + q(c)); err != nil {
			return err
		}
		delete(t.types, c)
		a.Kept = slices.DeleteFunc(a.Kept, func(s string) bool { return s == c })
	}
	if a != nil && ev.IndexesRead && !s.cfg.SkipIndexes {
		// The indexes as the source has them after the statement.
		if _, err := s.mirrorTx(ctx, tx, ev.Table, qname, t, a, ev.Indexes, false); err != nil {
			return err
		}
	}
	if a != nil {
		slices.Sort(a.Kept)
		if after, _ := json.Marshal(a); string(after) == string(before) {
			return nil
		}
		if err := setAlignment(ctx, tx, qname, a); err != nil {
			return fmt.Errorf("record the schema of %s: %w", qname, err)
		}
	}
	return nil
}

var _ tidemark.TableRegistry = (*Sink)(nil)

func (s *Sink) stateStore() (tidemark.TableStateStore, error) {
	st, ok := s.cfg.Checkpoints.(tidemark.TableStateStore)
	if !ok {
		return nil, fmt.Errorf("table states: the checkpoint store %T does not store them: %w", s.cfg.Checkpoints, errors.ErrUnsupported)
	}
	return st, nil
}

// TableStates implements tidemark.TableRegistry.
func (s *Sink) TableStates(ctx context.Context, source string) ([]tidemark.TableState, error) {
	store, err := s.stateStore()
	if err != nil {
		return nil, err
	}
	var out []tidemark.TableState
	err = s.retry(ctx, "read table states", func(ctx context.Context) error {
		var err error
		out, err = store.LoadTableStates(ctx, querier{s.pool}, source)
		return redact(err, s.secret)
	})
	return out, redact(err, s.secret)
}

// SetTableState implements tidemark.TableRegistry.
func (s *Sink) SetTableState(ctx context.Context, source string, st tidemark.TableState) error {
	store, err := s.stateStore()
	if err != nil {
		return err
	}
	err = s.retry(ctx, "record state of "+st.Table.String(), func(ctx context.Context) error {
		return redact(store.SaveTableState(ctx, querier{s.pool}, source, st), s.secret)
	})
	return redact(err, s.secret)
}

// HasTable implements tidemark.TableRegistry.
func (s *Sink) HasTable(ctx context.Context, id tidemark.TableID) (bool, error) {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return false, err
	}
	var exists bool
	err = s.retry(ctx, "look up "+qname, func(ctx context.Context) error {
		return redact(s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists), s.secret)
	})
	return exists, redact(err, s.secret)
}

// ResetTable implements tidemark.TableRegistry: it drops the target table
// and forgets the table's watermark, in one transaction.
func (s *Sink) ResetTable(ctx context.Context, source string, id tidemark.TableID) error {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return err
	}
	err = tidemark.Retry(ctx, "reset "+qname, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		return redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", ddlLockKey); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+qname); err != nil {
				return fmt.Errorf("drop %s: %w", qname, err)
			}
			if store, ok := s.cfg.Checkpoints.(tidemark.TableStateStore); ok {
				return store.DeleteWatermark(ctx, querier{tx}, source, id)
			}
			return nil
		}), s.secret)
	})
	s.forgetTable(id)
	return redact(err, s.secret)
}

// EnsureTable implements tidemark.TableRegistry.
func (s *Sink) EnsureTable(ctx context.Context, t *tidemark.Table) error {
	d, k, err := s.def(t)
	if err != nil {
		return err
	}
	if err := s.ensure(ctx, d, k); err != nil {
		return redact(err, s.secret)
	}
	return nil
}

// ensure creates or evolves d's target table in its own transaction, once
// per schema and process.
func (s *Sink) ensure(ctx context.Context, d *tableDef, k defKey) error {
	if s.isEnsured(k) {
		return nil
	}
	var directSafe bool
	var proj *projection
	err := tidemark.Retry(ctx, "prepare table "+d.display, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		directSafe, proj = false, nil
		return redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.ensureTx(ctx, tx, d, &directSafe, &proj) }), s.secret)
	})
	if err != nil {
		return err
	}
	s.setDirectSafe(k, directSafe)
	s.setProjection(k, proj)
	s.markEnsured(k)
	return nil
}

var _ tidemark.SourceLocker = (*Sink)(nil)

// sourceLockClass is the first key of the per-source advisory locks ("tm").
const sourceLockClass int32 = 0x746d

// TryLockSource implements tidemark.SourceLocker with a session-level
// advisory lock on a connection taken out of the pool: it is held until
// release, or until that connection ends (a killed process loses it at
// once).
func (s *Sink) TryLockSource(ctx context.Context, source string) (func(), bool, error) {
	h := fnv.New32a()
	h.Write([]byte(source))
	key := int32(h.Sum32())
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("lock source %s: %w", source, redact(err, s.secret))
	}
	var ok bool
	var started time.Time
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())",
		sourceLockClass, key).Scan(&ok, &started); err != nil {
		c.Release()
		return nil, false, fmt.Errorf("lock source %s: %w", source, redact(err, s.secret))
	}
	if !ok {
		c.Release()
		return nil, false, nil
	}
	l := &sourceLock{conn: c.Hijack(), key: key, started: started}
	l.pid = l.conn.PgConn().PID()
	s.lockMu.Lock()
	if s.locks == nil {
		s.locks = map[string]*sourceLock{}
	}
	s.locks[source] = l
	s.lockMu.Unlock()
	release := func() {
		s.lockMu.Lock()
		if s.locks[source] == l {
			delete(s.locks, source)
		}
		s.lockMu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = l.conn.Close(cctx) // ends the session, which releases the lock
	}
	return release, true, nil
}

// sourceLock is the session holding a source's lock.
type sourceLock struct {
	mu   sync.Mutex // the connection is used by one caller at a time
	conn *pgx.Conn
	key  int32
	// The session's backend process and its start: a pid alone may have
	// been reused by another session since.
	pid     uint32
	started time.Time
}

// retakeLock tries to take l's lock on conn. A lock still held by l's own
// earlier session (one this process can no longer reach, on a half-open
// connection the server has not noticed yet) is freed first by ending that
// session.
func (s *Sink) retakeLock(ctx context.Context, conn *pgx.Conn, l *sourceLock) (bool, error) {
	var ok bool
	var started time.Time
	lock := "SELECT pg_try_advisory_lock($1, $2), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
	if err := conn.QueryRow(ctx, lock, sourceLockClass, l.key).Scan(&ok, &started); err != nil {
		return false, err
	}
	if !ok {
		var ended bool
		err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(pg_terminate_backend(a.pid, 5000)), false)
	FROM pg_locks k JOIN pg_stat_activity a ON a.pid = k.pid
	WHERE k.locktype = 'advisory' AND k.classid::bigint = $1 AND k.objid::bigint = $2 AND k.objsubid = 2 AND k.granted
	AND k.pid = $3 AND a.backend_start = $4`,
			int64(uint32(sourceLockClass)), int64(uint32(l.key)), int64(l.pid), l.started).Scan(&ended)
		if err != nil || !ended {
			return false, err
		}
		if err := conn.QueryRow(ctx, lock, sourceLockClass, l.key).Scan(&ok, &started); err != nil || !ok {
			return false, err
		}
	}
	l.started = started
	return true, nil
}

var _ tidemark.SourceLockChecker = (*Sink)(nil)

// CheckSourceLock implements tidemark.SourceLockChecker: the session that
// took the lock still answers and still holds it (pg_locks). When that
// session has ended (a PostgreSQL restart, pg_terminate_backend,
// idle_session_timeout) the lock is taken again on a new session if it is
// free (retaken); held by another session, it is lost
// (tidemark.ErrSourceLockLost). A server that does not answer is neither.
func (s *Sink) CheckSourceLock(ctx context.Context, source string) (bool, error) {
	s.lockMu.Lock()
	l := s.locks[source]
	s.lockMu.Unlock()
	if l == nil {
		return false, fmt.Errorf("check lock of source %s: %w: not held by this process", source, tidemark.ErrSourceLockLost)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var held bool
	// An advisory lock on two int4 keys is classid = key1, objid = key2
	// (their bits as oids), objsubid = 2.
	err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
	AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 2 AND granted)`,
		int64(uint32(sourceLockClass)), int64(uint32(l.key))).Scan(&held)
	if err == nil && held {
		return false, nil
	}
	gone := "the lock's session no longer holds it"
	if err != nil {
		gone = "the lock's session is gone: " + redact(err, s.secret).Error()
	}
	// Take it again on a new session; the old one is closed (if it still
	// lives, closing it frees nothing this process still needs).
	c, aerr := s.pool.Acquire(ctx)
	if aerr != nil {
		return false, fmt.Errorf("check lock of source %s: %s; take it again: %w", source, gone, redact(aerr, s.secret))
	}
	ok, qerr := s.retakeLock(ctx, c.Conn(), l)
	if qerr != nil {
		c.Release()
		return false, fmt.Errorf("check lock of source %s: %s; take it again: %w", source, gone, redact(qerr, s.secret))
	}
	if !ok {
		c.Release()
		return false, fmt.Errorf("check lock of source %s: %w: %s, and another session holds it now", source, tidemark.ErrSourceLockLost, gone)
	}
	old := l.conn
	l.conn = c.Hijack()
	l.pid = l.conn.PgConn().PID()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = old.Close(cctx)
	return true, nil
}

// TruncateBefore implements tidemark.StreamTarget: a source TRUNCATE at
// version v as an applier of one partition sees it. Every row of the
// table's target at v or older is removed (soft-delete mode: marked
// deleted and stamped with v), rows written after the TRUNCATE are kept.
// Each partition's applier runs it when it reaches the TRUNCATE's control
// record; it is idempotent, so the table converges whatever the order: a row
// that a lagging partition writes with an older version after the first run
// is removed again when that partition reaches its own control record.
// ddl.truncate: refuse refuses it like ApplyDDL (a *tidemark.TableError).
func (s *Sink) TruncateBefore(ctx context.Context, table tidemark.TableID, v tidemark.Version, commit time.Time) error {
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return &tidemark.TableError{Table: table, Err: err}
	}
	if s.cfg.Schema.Truncate != ApplyDDL {
		return &tidemark.TableError{Table: table, Err: fmt.Errorf("TRUNCATE refused by the configuration (ddl.truncate: refuse); the target table %s is kept as it was: %w", qname, tidemark.ErrDDLRefused)}
	}
	// At or before v: a snapshot at v saw only what came before the
	// TRUNCATE (tidemark.Version: a DDL event shares its version).
	q := "DELETE FROM " + qname + " WHERE (" + colSeq + ", " + colIdx + ") <= ($1, $2)"
	args := []any{int64(v.Seq), int64(v.Index)}
	var at any // _tm_deleted_at: the source commit time, NULL when unknown
	if !commit.IsZero() {
		at = commit
	}
	if s.cfg.DeleteMode == DeleteSoft {
		q = "UPDATE " + qname + " SET " + colDeleted + " = true, " + colDeletedAt + " = $3, " + colSeq + " = $1, " + colIdx + " = $2 WHERE (" +
			colSeq + ", " + colIdx + ") <= ($1, $2) AND NOT " + colDeleted
		args = append(args, at)
	}
	if _, err := s.execIfExists(ctx, "truncate "+qname+" before version "+v.String(), qname, q, args...); err != nil {
		return err
	}
	s.log.Info("truncated target rows older than a source TRUNCATE", "table", qname, "version", v.String())
	return nil
}

// execIfExists runs q (what, in errors and retries) when the table qname
// exists and returns the rows it affected.
func (s *Sink) execIfExists(ctx context.Context, what, qname, q string, args ...any) (int64, error) {
	var n int64
	err := s.retry(ctx, what, func(ctx context.Context) error {
		n = 0
		var exists bool
		if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
			return redact(fmt.Errorf("look up %s: %w", qname, err), s.secret)
		}
		if !exists {
			return nil
		}
		tag, err := s.pool.Exec(ctx, q, args...)
		if isUndefinedTable(err) {
			return nil // dropped since to_regclass looked
		}
		n = tag.RowsAffected()
		return redact(err, s.secret)
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, nil
}

// RemoveBefore implements tidemark.StreamTarget: the end of a snapshot of
// table stamped v, as an applier of one partition sees it. Every target row
// older than v was not in the snapshot (its rows are at v) and is removed;
// in soft-delete mode it is marked deleted and keeps its version (a
// snapshot row at v of a lagging partition then still wins over it). A row
// at v or newer is a snapshot row or a change the snapshot did not see
// (tidemark.Snapshot: v is above everything the read saw), which another
// partition may already have applied: it stays. Idempotent, any order.
func (s *Sink) RemoveBefore(ctx context.Context, table tidemark.TableID, v tidemark.Version) (int64, error) {
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return 0, &tidemark.TableError{Table: table, Err: err}
	}
	// The snapshot's rows are at v (Batch.Refresh).
	cond := "(" + colSeq + ", " + colIdx + ") < ($1, $2)"
	q := "DELETE FROM " + qname + " WHERE " + cond
	if s.cfg.DeleteMode == DeleteSoft {
		q = "UPDATE " + qname + " SET " + colDeleted + " = true, " + colDeletedAt + " = NULL WHERE " + cond + " AND NOT " + colDeleted
	}
	n, err := s.execIfExists(ctx, "remove rows of "+qname+" older than snapshot "+v.String(), qname, q, int64(v.Seq), int64(v.Index))
	if err != nil {
		return 0, err
	}
	s.log.Info("removed target rows older than a snapshot (gone from the source)", "table", qname, "version", v.String(), "rows", n)
	return n, nil
}

// errTableGone says that a table dropped under DropBefore's transaction.
var errTableGone = errors.New("table dropped meanwhile")

// DropBefore implements tidemark.StreamTarget: a source DROP TABLE at
// version v as an applier of one partition sees it. Under the DDL lock and
// an exclusive lock of the target table, every row at v or older is removed
// (in soft-delete mode too: the direct path drops the whole table), and the
// table is dropped when no row is left. Rows of a table created again
// under the same name after the DROP are newer and keep it. Each
// partition's applier runs it when it reaches the DROP's control record;
// it is idempotent, so the table converges whatever the order.
// ddl.drop_table: refuse refuses it like ApplyDDL (a *tidemark.TableError),
// unless there is no target table to keep.
func (s *Sink) DropBefore(ctx context.Context, table tidemark.TableID, v tidemark.Version) error {
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return &tidemark.TableError{Table: table, Err: err}
	}
	var removed int64
	var dropped, exists bool
	err = s.retry(ctx, "drop "+qname+" before version "+v.String(), func(ctx context.Context) error {
		removed, dropped, exists = 0, false, false
		return redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", ddlLockKey); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", qname).Scan(&exists); err != nil {
				return fmt.Errorf("look up %s: %w", qname, err)
			}
			if !exists || s.cfg.Schema.DropTable != ApplyDDL {
				return nil
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE "+qname+" IN ACCESS EXCLUSIVE MODE"); err != nil {
				if isUndefinedTable(err) {
					// Another applier dropped it since to_regclass
					// looked (its catalog snapshot was older).
					return errTableGone
				}
				return fmt.Errorf("lock %s: %w", qname, err)
			}
			// At or before v, like TruncateBefore.
			tag, err := tx.Exec(ctx, "DELETE FROM "+qname+" WHERE ("+colSeq+", "+colIdx+") <= ($1, $2)", int64(v.Seq), int64(v.Index))
			if err != nil {
				return fmt.Errorf("delete rows of %s: %w", qname, err)
			}
			removed = tag.RowsAffected()
			var left bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+qname+")").Scan(&left); err != nil {
				return fmt.Errorf("count rows of %s: %w", qname, err)
			}
			if left {
				return nil
			}
			if _, err := tx.Exec(ctx, "DROP TABLE "+qname); err != nil {
				return fmt.Errorf("drop %s: %w", qname, err)
			}
			dropped = true
			return nil
		}), s.secret)
	})
	if errors.Is(err, errTableGone) {
		exists, err = false, nil
	}
	if err != nil {
		return fmt.Errorf("drop %s before version %s: %w", qname, v, err)
	}
	if exists && s.cfg.Schema.DropTable != ApplyDDL {
		return &tidemark.TableError{Table: table, Err: fmt.Errorf("DROP TABLE refused by the configuration (ddl.drop_table: refuse); the target table %s is kept as it was: %w", qname, tidemark.ErrDDLRefused)}
	}
	if dropped {
		s.forgetTable(table)
	}
	s.log.Info("dropped target rows older than a source DROP TABLE", "table", qname, "version", v.String(), "rows", removed, "table_dropped", dropped)
	return nil
}
