package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

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
	// deferNotNull (a load's ensure, ensureTx) records a NOT NULL the
	// table lacks in alignment.PendingNotNull instead of setting it.
	deferNotNull bool
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
	// PendingNotNull lists the columns whose source NOT NULL a load
	// deferred (ensureTx): MirrorIndexes sets it after the load, or,
	// after a chunked load (MirrorIndexesAfter), the first batch past the
	// load's high watermark does, with the held unique constraints
	// (UniqueAfter, heldunique.go); an evolution outside a load and
	// outside that wait sets it at once.
	PendingNotNull []string `json:"pending_not_null,omitempty"`
	// UniqueAfterLoad is set while a load (ensureTx) has dropped the
	// table's mirrored unique constraints: only MirrorIndexes, after the
	// load, builds them again (indexes.go, "During a load").
	UniqueAfterLoad bool `json:"unique_after_load,omitempty"`
	// UniqueAfter, set beside UniqueAfterLoad once the load's rows are in
	// (MirrorIndexesAfter), holds those constraints until the stream has
	// applied past the load's high watermark (indexes.go, "Built once the
	// target is consistent").
	UniqueAfter *uniqueAfter `json:"unique_after,omitempty"`
	// KeyPending is set while the table has no primary key yet: a fresh
	// load (tidemark.Batch.FreshLoad) created it without one, and the
	// first ensure of anything else or MirrorIndexes after the load
	// builds it (keyafter.go).
	KeyPending bool `json:"key_pending,omitempty"`
}

// uniqueAfter is a table's unique constraints waiting for the stream.
type uniqueAfter struct {
	// Source is the source whose checkpoint must pass After.
	Source string `json:"source"`
	// Table is the source table (tidemark.TableID.String()).
	Table string `json:"table"`
	// After is the high watermark: a source position captured after the
	// load's last read.
	After string `json:"after"`
	// Create maps each constraint to build to its statement (kept up to
	// date by the DDL events meanwhile: mirrorTx).
	Create map[string]string `json:"create,omitempty"`
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
// source schema under policy; at is the layout's version (layoutVersion:
// zero when unknown), which the new alignment records when the layout
// differs from the one the table is aligned to (or that records none).
func (d *tableDef) evolve(t *targetTable, policy SchemaPolicy, at tidemark.Version) (*evolution, error) {
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
		ev.align.UniqueAfterLoad = old.UniqueAfterLoad
		ev.align.UniqueAfter = old.UniqueAfter
		if old.UniqueAfter != nil {
			// The NOT NULL a load deferred waits with its held unique
			// constraints for the stream (heldunique.go).
			ev.align.PendingNotNull = slices.Clone(old.PendingNotNull)
		}
	}
	// held: the table's constraints wait for the stream to pass a load's
	// high watermark; a NOT NULL the source gains meanwhile waits too.
	held := old != nil && old.UniqueAfter != nil
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
	ev.align.Seq, ev.align.Idx = alignedSince(d, old, ev.align, at)
	// NOT NULL: the source's (mirrored, d.notNull), dropped where the
	// source dropped it; a kept column gets NULL in new rows.
	for i, c := range d.table.Columns {
		if want, have := d.notNull[i], t.notNull[c.Name] && !added[c.Name]; want != have && !d.keySet[i] {
			if want {
				if policy.KeepNullable {
					continue
				}
				if policy.deferNotNull || held {
					if !slices.Contains(ev.align.PendingNotNull, c.Name) {
						ev.align.PendingNotNull = append(ev.align.PendingNotNull, c.Name)
					}
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

// alignedSince is the version the new alignment a (of d's layout, version
// at) records: the schema record's (d.table.Since) when the source knows
// it; else the old alignment's when the layout is the one it describes
// and it records one (the layout was in effect then already), or at (the
// version of a change written with the new layout: every change of
// another layout below it is history, older.go).
func alignedSince(d *tableDef, old, a *alignment, at tidemark.Version) (uint64, uint32) {
	if d.table.Since != (tidemark.Version{}) {
		return d.table.Since.Seq, d.table.Since.Index
	}
	if old == nil {
		return at.Seq, at.Index
	}
	if at == (tidemark.Version{}) || (old.since() != (tidemark.Version{}) && sameLayout(old, a)) {
		return old.Seq, old.Idx
	}
	return at.Seq, at.Index
}

// sameLayout reports whether two alignments describe the same columns, key
// and kept columns.
func sameLayout(a, b *alignment) bool {
	return slices.Equal(a.Columns, b.Columns) && slices.Equal(a.Key, b.Key) && slices.Equal(a.Kept, b.Kept)
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
