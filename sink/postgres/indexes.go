package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"tidemark"
)

// Index and constraint mirroring (docs/schema-changes.md, "Indexes and NOT
// NULL").
//
// The source's secondary indexes (tidemark.Index) are mirrored onto the
// target table, never while a table is first loaded: a new target table is
// created with its primary key only, and MirrorIndexes builds the indexes
// once the snapshot has loaded it (one sort per index instead of index
// maintenance per row). After that, every ALTER TABLE / CREATE INDEX /
// DROP INDEX of the source carries the table's indexes (DDLEvent.Indexes)
// and ApplyDDL brings the mirror to them in the DDL's transaction.
//
//   - A non-unique index is CREATE INDEX on the same columns, in the same
//     order and direction.
//   - A unique index is a UNIQUE constraint, DEFERRABLE INITIALLY DEFERRED:
//     the sink writes a batch's final values in one statement, and an
//     immediate check would fail on values two rows swap within the batch
//     (the source checks row by row, in its own order). Checked at commit,
//     the target holds exactly what the source allowed. In delete mode
//     soft, and for a unique prefix index, it is an exclusion constraint
//     (btree, =) — deferrable too — so that tombstones (WHERE NOT
//     _tm_deleted) and prefixes can be expressed.
//   - A prefix part (KEY (body(100))) indexes left(col, n) for text and
//     substring(col from 1 for n) for bytea: MySQL counts characters
//     (bytes for binary strings), and so do those functions. A query must
//     use the same expression to use such an index. Whole values of a long
//     column would also overflow PostgreSQL's b-tree entry limit (~2700
//     bytes), which is why the source indexes a prefix.
//   - FULLTEXT, SPATIAL and other non-b-tree indexes, an index on a column
//     that is not replicated (exclude_columns) and an index whose name is
//     not a valid identifier are skipped, with one log line naming the
//     index and why.
//
// Names: "<table>_<index>", cut to PostgreSQL's 63 bytes with a hash of the
// full name when longer. The alignment comment records every index and
// constraint the sink created, with its statement: only those are ever
// dropped or rebuilt (an index added by hand on the target stays), and a
// changed definition (a different column list under the same name, a
// renamed column) is dropped and built again.
//
// During a load (the OpRead rows of a snapshot or catch-up, ensureTx) into
// an existing table, the mirrored unique constraints are dropped first
// (dropUniqueForLoad, alignment.UniqueAfterLoad) and only MirrorIndexes,
// which every load of the daemon calls once its rows are in, builds them
// again; the stream and the DDL events leave them away meanwhile. A load
// commits chunk by chunk, and a full read over a target that holds the
// table (a first run again after a deleted checkpoint, a purged binlog)
// passes through states the source never had: a row given a unique value
// that a stale row, rewritten by a later chunk, still holds. Readers see
// the table without those constraints until the load ends. The primary key
// (the business key, the upserts' arbiter) always stays. A daemon's load
// then holds them further (MirrorIndexesAfter, heldunique.go): a chunked
// read leaves a target mixed from several read times, consistent only
// once the stream has applied past a position captured after the load's
// last read; the first batch at or past it builds them.
//
// A constraint the target's rows cannot satisfy — SET NOT NULL over a
// NULL, a unique index over duplicates, at DDL time or when a batch
// commits — means the target is not what the source holds (for example an
// ALTER … NOT NULL that turned NULLs into defaults on the source without
// logging them, which the binlog cannot show). Nothing is dropped and
// nothing is skipped in silence: the table is quarantined with one message
// naming the constraint and the column, and `tidemark resync --table`
// reloads it from the source, after which the constraint is built again.

// pgNameMax is PostgreSQL's identifier limit in bytes (NAMEDATALEN - 1).
const pgNameMax = 63

// pgIndexName returns the target name of a source index of table.
func pgIndexName(table, index string) string {
	n := table + "_" + index
	if len(n) <= pgNameMax {
		return n
	}
	h := fnv.New32a()
	h.Write([]byte(n))
	return hashedName(n, h.Sum32())
}

// pgIndexAltName returns the name a source index of table takes when its
// pgIndexName belongs to another relation of the schema. "<table>_<index>"
// is ambiguous (table a's index b_c and table a_b's index c are both
// a_b_c; cut to 63 bytes, so are their hashes), and index, constraint and
// table names share one namespace per schema: this one hashes the pair
// itself.
func pgIndexAltName(table, index string) string {
	h := fnv.New32a()
	h.Write([]byte(table))
	h.Write([]byte{0})
	h.Write([]byte(index))
	return hashedName(table+"_"+index, h.Sum32())
}

// hashedName returns n cut, at a character boundary, to fit pgNameMax
// bytes with the suffix "_<sum>".
func hashedName(n string, sum uint32) string {
	suffix := fmt.Sprintf("_%08x", sum)
	cut := min(len(n), pgNameMax-len(suffix))
	for cut > 0 && cut < len(n) && !utf8.RuneStart(n[cut]) {
		cut--
	}
	return n[:cut] + suffix
}

// indexSpec is the mirror of one source index.
type indexSpec struct {
	name   string     // target name (index or constraint)
	create string     // statement that creates it
	drop   string     // statement that drops it
	alt    *indexSpec // the same under pgIndexAltName, when name is another relation's
}

// skippedIndex is a source index that cannot be mirrored, and why.
// implied is set for a unique index on exactly the business key's
// columns, which the target's primary key already enforces.
type skippedIndex struct {
	index   string
	reason  string
	implied bool
}

// impliedReason is why a unique index on the business key is not mirrored.
const impliedReason = "the business key: enforced by the primary key, not created again"

// sameColumns reports whether two column lists hold the same set.
func sameColumns(a, b []string) bool {
	return len(a) == len(b) && len(a) > 0 && slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// indexSpecs maps the source indexes of a table to target statements.
// types holds the target's columns and their (canonical) types; key is the
// business key, the target's primary key.
//
// A unique index on exactly the business key's columns (the seed
// incident's `UNIQUE KEY (order_id, line_item_id)` with those columns as
// business_keys, or a UNIQUE index repeating the primary key) is not
// mirrored: the primary key enforces the same uniqueness at once, and is
// the arbiter of the upserts' ON CONFLICT (key). A second, DEFERRABLE
// constraint on those columns would be inferred as an arbiter too, which
// PostgreSQL refuses (SQLSTATE 55000).
func indexSpecs(schema, table, qname string, soft bool, types map[string]string, key []string, idx []tidemark.Index) ([]indexSpec, []skippedIndex) {
	var out []indexSpec
	var skipped []skippedIndex
	q := tidemark.QuotePostgres
	for _, ix := range idx {
		if ix.Type != "" && ix.Type != "BTREE" && ix.Type != "HASH" {
			skipped = append(skipped, skippedIndex{index: ix.Name, reason: fmt.Sprintf("a %s index has no PostgreSQL b-tree equivalent", ix.Type)})
			continue
		}
		if err := tidemark.CheckIdentifier("index", ix.Name); err != nil {
			skipped = append(skipped, skippedIndex{index: ix.Name, reason: err.Error()})
			continue
		}
		if len(ix.Columns) == 0 {
			continue
		}
		var parts []string
		prefixed, bad := false, ""
		for _, c := range ix.Columns {
			typ, ok := types[c.Name]
			if !ok || strings.HasPrefix(c.Name, reservedPrefix) {
				bad = fmt.Sprintf("column %q is not replicated (exclude_columns?)", c.Name)
				break
			}
			expr := q(c.Name)
			if c.Prefix > 0 {
				switch {
				case typ == "bytea":
					expr = fmt.Sprintf("(substring(%s from 1 for %d))", q(c.Name), c.Prefix)
					prefixed = true
				case typ == "text" || strings.HasPrefix(typ, "character"):
					expr = fmt.Sprintf("(left(%s, %d))", q(c.Name), c.Prefix)
					prefixed = true
				}
			}
			parts = append(parts, expr)
		}
		if bad != "" {
			skipped = append(skipped, skippedIndex{index: ix.Name, reason: bad})
			continue
		}
		if ix.Unique && !prefixed {
			names := make([]string, len(ix.Columns))
			for i, c := range ix.Columns {
				names[i] = c.Name
			}
			if sameColumns(names, key) {
				skipped = append(skipped, skippedIndex{index: ix.Name, reason: impliedReason, implied: true})
				continue
			}
		}
		name := pgIndexName(table, ix.Name)
		if name == table+"_pkey" {
			skipped = append(skipped, skippedIndex{index: ix.Name, reason: "its target name " + name + " is the primary key's"})
			continue
		}
		if !ix.Unique {
			for i, c := range ix.Columns {
				if c.Desc {
					parts[i] += " DESC"
				}
			}
		}
		build := func(name string) indexSpec {
			sp := indexSpec{name: name}
			switch {
			case ix.Unique && !soft && !prefixed:
				sp.create = fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s UNIQUE (%s) DEFERRABLE INITIALLY DEFERRED", qname, q(name), strings.Join(parts, ", "))
				sp.drop = fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s", qname, q(name))
			case ix.Unique:
				elems := make([]string, len(parts))
				for i, p := range parts {
					elems[i] = p + " WITH ="
				}
				where := ""
				if soft {
					where = fmt.Sprintf(" WHERE (NOT %s)", q(colDeleted))
				}
				sp.create = fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s EXCLUDE USING btree (%s)%s DEFERRABLE INITIALLY DEFERRED", qname, q(name), strings.Join(elems, ", "), where)
				sp.drop = fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s", qname, q(name))
			default:
				sp.create = fmt.Sprintf("CREATE INDEX %s ON %s (%s)", q(name), qname, strings.Join(parts, ", "))
				sp.drop = fmt.Sprintf("DROP INDEX IF EXISTS %s.%s", q(schema), q(name))
			}
			return sp
		}
		sp, alt := build(name), build(pgIndexAltName(table, ix.Name))
		sp.alt = &alt
		out = append(out, sp)
	}
	return out, skipped
}

// resolveNames gives each spec whose name another relation of the schema
// holds (a table, or another table's index or constraint) its alternative
// name (pgIndexAltName), as does a spec the alignment a records under it:
// the choice stays as it was made, and PostgreSQL never answers a mirror
// with "relation already exists" for two valid source tables.
func (s *Sink) resolveNames(ctx context.Context, tx pgx.Tx, schema, qname string, a *alignment, specs []indexSpec) ([]indexSpec, error) {
	names := make([]string, 0, len(specs))
	for _, sp := range specs {
		names = append(names, sp.name)
	}
	if len(names) == 0 {
		return specs, nil
	}
	rows, err := tx.Query(ctx, `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = ANY ($2::name[])
  AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indexrelid = c.oid AND i.indrelid = to_regclass($3))`, schema, names, qname)
	if err != nil {
		return nil, fmt.Errorf("read the relation names of schema %s: %w", schema, err)
	}
	taken, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the relation names of schema %s: %w", schema, err)
	}
	out := make([]indexSpec, len(specs))
	for i, sp := range specs {
		out[i] = sp
		if sp.alt == nil {
			continue
		}
		_, here := a.Indexes[sp.name]
		_, there := a.Indexes[sp.alt.name]
		if there && !here || slices.Contains(taken, sp.name) {
			out[i] = *sp.alt
		}
	}
	return out, nil
}

// freeTableName makes d's name free for its target table when an index
// of another table holds it: tidemark's mirror of table p's index q is
// p_q, and the source may have a table p_q too (CREATE TABLE IF NOT
// EXISTS would skip it, the index standing for the table). A mirror is
// renamed to its alternative name (pgIndexAltName, which resolveNames
// keeps for it from now on) and its table's alignment records it so; an
// index tidemark did not create is d's table's problem, named.
func (s *Sink) freeTableName(ctx context.Context, tx pgx.Tx, d *tableDef) error {
	var owner string
	err := tx.QueryRow(ctx, `SELECT o.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_index i ON i.indexrelid = c.oid JOIN pg_class o ON o.oid = i.indrelid
WHERE n.nspname = $1 AND c.relname = $2::name`, d.schema, d.name).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return d.wrap("look up the relation named as", err)
	}
	q := tidemark.QuotePostgres
	oq := q(d.schema) + "." + q(owner)
	ot, err := readTarget(ctx, tx, oq)
	if err != nil {
		return d.wrap("read the table of the index named as", err)
	}
	create := ""
	if ot.align != nil {
		create = ot.align.Indexes[d.name]
	}
	src, plain := strings.CutPrefix(d.name, owner+"_")
	if create == "" || !plain {
		return d.incompatible("the target schema %s has an index %s of table %s that tidemark did not create under this table's name: rename or drop it", q(d.schema), q(d.name), oq)
	}
	alt := pgIndexAltName(owner, src)
	var renamed string
	for _, prefix := range []string{"CREATE INDEX ", "ALTER TABLE " + oq + " ADD CONSTRAINT "} {
		if rest, ok := strings.CutPrefix(create, prefix+q(d.name)+" "); ok {
			renamed = prefix + q(alt) + " " + rest
		}
	}
	if renamed == "" {
		return d.incompatible("the target schema %s has an index %s of table %s under this table's name, recorded as %q: rename or drop it", q(d.schema), q(d.name), oq, create)
	}
	stmt := "ALTER INDEX " + q(d.schema) + "." + q(d.name) + " RENAME TO " + q(alt)
	s.log.Info("renaming a mirrored index that has the name of a new target table", "table", d.display, "index_table", oq, "ddl", stmt)
	if _, err := tx.Exec(ctx, stmt); err != nil {
		return d.wrap("rename the index named as", err)
	}
	delete(ot.align.Indexes, d.name)
	ot.align.Indexes[alt] = renamed
	if err := setAlignment(ctx, tx, oq, ot.align); err != nil {
		return d.wrap("record the renamed index of", err)
	}
	return nil
}

// dropFor returns the statement that drops a mirrored index recorded with
// its create statement.
func dropFor(schema, qname, name, create string) string {
	if strings.HasPrefix(create, "ALTER TABLE") {
		return fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s", qname, tidemark.QuotePostgres(name))
	}
	return fmt.Sprintf("DROP INDEX IF EXISTS %s.%s", tidemark.QuotePostgres(schema), tidemark.QuotePostgres(name))
}

// mirrorTx brings the mirrored indexes of the target table (t, with
// alignment a, which it updates) to idx, in tx. With dry it only returns
// the statements it would run.
func (s *Sink) mirrorTx(ctx context.Context, tx pgx.Tx, id tidemark.TableID, qname string, t *targetTable, a *alignment, idx []tidemark.Index, dry bool) ([]string, error) {
	schema, table, _, err := s.targetOf(id)
	if err != nil {
		return nil, &tidemark.TableError{Table: id, Err: err}
	}
	specs, skipped := indexSpecs(schema, table, qname, s.cfg.DeleteMode == DeleteSoft, t.types, a.Key, idx)
	for _, sk := range skipped {
		s.logSkipOnce(id, sk)
	}
	existing := map[string]bool{}
	if t.exists {
		rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass`, qname)
		if err != nil {
			return nil, fmt.Errorf("read the indexes of %s: %w", qname, err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("read the indexes of %s: %w", qname, err)
		}
		for _, n := range names {
			existing[n] = true
		}
	}
	if specs, err = s.resolveNames(ctx, tx, schema, qname, a, specs); err != nil {
		return nil, err
	}
	want := map[string]indexSpec{}
	for _, sp := range specs {
		want[sp.name] = sp
	}
	var stmts []string
	managed := maps.Clone(a.Indexes)
	if managed == nil {
		managed = map[string]string{}
	}
	// Drop what the source no longer has, or has differently.
	for _, name := range slices.Sorted(maps.Keys(managed)) {
		create := managed[name]
		if sp, ok := want[name]; ok && sp.create == create && existing[name] {
			continue
		}
		if existing[name] {
			stmts = append(stmts, dropFor(schema, qname, name, create))
			existing[name] = false
		}
		delete(managed, name)
	}
	var creates []indexSpec
	held := map[string]string{} // unique constraints waiting (a.UniqueAfter)
	for _, sp := range specs {
		if _, ok := managed[sp.name]; ok {
			continue
		}
		if existing[sp.name] {
			s.logSkipOnce(id, skippedIndex{index: sp.name, reason: "the target table already has an index of that name that tidemark did not create"})
			continue
		}
		if a.UniqueAfterLoad && strings.HasPrefix(sp.create, "ALTER TABLE") {
			// A load dropped it: built after the load (MirrorIndexes),
			// or once the stream has passed the load's high watermark
			// (a.UniqueAfter, buildHeldUnique).
			held[sp.name] = sp.create
			continue
		}
		stmts = append(stmts, sp.create)
		creates = append(creates, sp)
	}
	if a.UniqueAfter != nil && !dry {
		if len(held) == 0 {
			held = nil
		}
		u := *a.UniqueAfter
		u.Create = held
		a.UniqueAfter = &u
	}
	if dry || len(stmts) == 0 {
		return stmts, nil
	}
	for _, stmt := range stmts {
		s.log.Info("mirroring the indexes of the source", "table", qname, "source_table", id.String(), "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			if cerr := constraintFailed(id, qname, err); cerr != nil {
				return nil, cerr
			}
			return nil, fmt.Errorf("mirror the indexes of %s: %w", qname, err)
		}
	}
	for _, sp := range creates {
		managed[sp.name] = sp.create
	}
	if len(managed) == 0 {
		managed = nil
	}
	a.Indexes = managed
	return stmts, nil
}

// deferredKeyConstraints finds the DEFERRABLE unique constraints of the
// existing target table t (d's) on exactly the business key's columns.
// PostgreSQL infers every unique index on the ON CONFLICT columns as an
// arbiter and refuses a deferrable one (SQLSTATE 55000), so each of them
// would stop every upsert into the table. Releases before the business key
// was compared with the unique indexes mirrored such a source index (the
// seed incident's `UNIQUE KEY (order_id, line_item_id)` with those columns
// as business_keys): a constraint the alignment records as tidemark's own
// is dropped — the primary key enforces the same uniqueness, immediately —
// and the statements are returned. One tidemark did not create is not
// touched: a *tidemark.TableError naming it quarantines the table.
func deferredKeyConstraints(ctx context.Context, tx pgx.Tx, d *tableDef, t *targetTable) ([]indexSpec, error) {
	key := slices.Sorted(slices.Values(d.table.KeyNames()))
	rows, err := tx.Query(ctx, `SELECT c.conname::text FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid
WHERE c.conrelid = $1::regclass AND c.contype = 'u' AND c.condeferrable AND i.indexprs IS NULL AND i.indpred IS NULL
  AND (SELECT array_agg(a.attname::text ORDER BY a.attname COLLATE "C") FROM pg_attribute a
       WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])) = $2::text[]
ORDER BY 1`, d.qname, key)
	if err != nil {
		return nil, d.wrap("read the unique constraints of", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, d.wrap("read the unique constraints of", err)
	}
	var drops []indexSpec
	for _, n := range names {
		if t.align == nil || t.align.Indexes[n] == "" {
			return nil, d.incompatible("constraint %q on the business key (%s) is DEFERRABLE: ON CONFLICT cannot use it as the upserts' arbiter; "+
				"drop it (the primary key enforces the same uniqueness) or make it NOT DEFERRABLE", n, strings.Join(d.table.KeyNames(), ", "))
		}
		drops = append(drops, indexSpec{name: n, drop: fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s", d.qname, tidemark.QuotePostgres(n))})
		delete(t.align.Indexes, n)
	}
	if t.align != nil && len(t.align.Indexes) == 0 {
		t.align.Indexes = nil
	}
	return drops, nil
}

// arbiterNotes are plan's comments on a table it creates: the upserts'
// arbiter, and the unique indexes it stands for.
func (s *Sink) arbiterNotes(d *tableDef, idx []tidemark.Index) []string {
	q := make([]string, len(d.table.Key))
	for i, n := range d.table.KeyNames() {
		q[i] = tidemark.QuotePostgres(n)
	}
	out := []string{fmt.Sprintf("-- upserts: ON CONFLICT (%s), the primary key (not deferrable)", strings.Join(q, ", "))}
	if s.cfg.SkipIndexes {
		return out
	}
	types := map[string]string{}
	for i, c := range d.table.Columns {
		types[c.Name] = canonType(d.types[i])
	}
	_, skipped := indexSpecs(d.schema, d.name, d.qname, d.soft, types, d.table.KeyNames(), idx)
	for _, sk := range skipped {
		if sk.implied {
			out = append(out, fmt.Sprintf("-- source index %s is %s", sk.index, sk.reason))
		}
	}
	return out
}

// logSkipOnce logs, once per process, that an index is not mirrored.
func (s *Sink) logSkipOnce(id tidemark.TableID, sk skippedIndex) {
	key := id.String() + "\x00" + sk.index + "\x00" + sk.reason
	s.mu.Lock()
	seen := s.skipLogged[key]
	s.skipLogged[key] = true
	s.mu.Unlock()
	switch {
	case seen:
	case sk.implied:
		s.log.Info("index not mirrored", "source_table", id.String(), "index", sk.index, "reason", sk.reason)
	default:
		s.log.Warn("index not mirrored", "source_table", id.String(), "index", sk.index, "reason", sk.reason)
	}
}

var (
	_ tidemark.IndexMirror      = (*Sink)(nil)
	_ tidemark.IndexMirrorAfter = (*Sink)(nil)
)

// MirrorIndexes implements tidemark.IndexMirror, in one transaction under
// the DDL lock. It first sets the NOT NULL a load deferred
// (alignment.PendingNotNull): a NULL left in such a column quarantines the
// table (constraintFailed names it). It builds the unique constraints a
// load dropped (alignment.UniqueAfterLoad, dropUniqueForLoad): rows that
// violate one quarantine the table the same way. With Config.SkipIndexes
// it mirrors no index.
func (s *Sink) MirrorIndexes(ctx context.Context, id tidemark.TableID, idx []tidemark.Index) error {
	return s.mirrorIndexes(ctx, "", id, idx, tidemark.Position{})
}

// MirrorIndexesAfter implements tidemark.IndexMirrorAfter: MirrorIndexes,
// except that the unique constraints not built yet (those a load dropped,
// those of a table the load created) wait until the stream of source has
// applied past after (alignment.UniqueAfter): the target a load leaves is
// mixed from several read times until then (heldunique.go). A zero after
// builds them now.
func (s *Sink) MirrorIndexesAfter(ctx context.Context, source string, id tidemark.TableID, idx []tidemark.Index, after tidemark.Position) error {
	return s.mirrorIndexes(ctx, source, id, idx, after)
}

func (s *Sink) mirrorIndexes(ctx context.Context, source string, id tidemark.TableID, idx []tidemark.Index, after tidemark.Position) error {
	_, _, qname, err := s.targetOf(id)
	if err != nil {
		return err
	}
	var held *uniqueAfter
	err = tidemark.Retry(ctx, "mirror the indexes of "+qname, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		held = nil
		return s.ddlTx(ctx, func(tx pgx.Tx) error {
			t, err := readTarget(ctx, tx, qname)
			if err != nil {
				return fmt.Errorf("read the target schema of %s: %w", qname, err)
			}
			if !t.exists || t.align == nil {
				return nil // nothing loaded yet, or not a table tidemark aligns
			}
			// A fresh load's table takes its primary key first
			// (keyafter.go): the stream's upserts need it, and it holds
			// for every read time (one row per key).
			pending := t.align.KeyPending || len(t.align.PendingNotNull) > 0 || t.align.UniqueAfterLoad
			if err := s.buildKey(ctx, tx, id, qname, t); err != nil {
				return err
			}
			// A NOT NULL the load deferred waits for the stream like the
			// unique constraints: a row the load copied early whose
			// source row was deleted since, or the load read in an
			// older layout, holds NULL until the stream's delete or
			// backfill reaches it (nemesis seed 16).
			holdNotNull := !after.IsZero() && len(t.align.PendingNotNull) > 0
			if !holdNotNull {
				if err := s.setPendingNotNull(ctx, tx, id, qname, t); err != nil {
					return err
				}
			}
			if !after.IsZero() && (!s.cfg.SkipIndexes || holdNotNull) {
				// Every unique constraint not built yet — the ones a load
				// dropped, those of a table the load created — and every
				// NOT NULL the load deferred is held until the stream has
				// passed the high watermark (mirrorTx fills Create).
				t.align.UniqueAfterLoad = true
				t.align.UniqueAfter = &uniqueAfter{Source: source, Table: id.String(), After: after.String()}
				held = t.align.UniqueAfter
			} else {
				// The unique constraints a load dropped are built now.
				t.align.UniqueAfterLoad = false
				t.align.UniqueAfter = nil
			}
			before := maps.Clone(t.align.Indexes)
			if !s.cfg.SkipIndexes {
				if _, err := s.mirrorTx(ctx, tx, id, qname, t, t.align, idx, false); err != nil {
					return err
				}
			}
			if held != nil && len(t.align.UniqueAfter.Create) == 0 && len(t.align.PendingNotNull) == 0 {
				// Nothing to wait for.
				t.align.UniqueAfterLoad = false
				t.align.UniqueAfter = nil
				held = nil
			}
			if held != nil {
				pending = true
				held = t.align.UniqueAfter
				s.log.Info("the mirrored unique constraints a load dropped and the NOT NULL it deferred wait until the stream has applied past the load's high watermark (the target is mixed from several read times until then)",
					"table", qname, "source_table", id.String(), "after", after.String(), "constraints", len(held.Create), "not_null", len(t.align.PendingNotNull))
			}
			if !pending && maps.Equal(before, t.align.Indexes) {
				return nil
			}
			if err := setAlignment(ctx, tx, qname, t.align); err != nil {
				return fmt.Errorf("record the indexes of %s: %w", qname, err)
			}
			return nil
		})
	})
	if err == nil {
		s.holdUnique(id, held, after)
		// The next load into the table ensures again (and drops the
		// unique constraints built now: dropUniqueForLoad).
		s.forgetTable(id)
	}
	return redact(err, s.secret)
}

// setPendingNotNull sets the NOT NULL a load deferred on t's columns
// (alignment.PendingNotNull, cleared in t.align; the caller records it). A
// column that still holds a NULL fails with the *tidemark.TableError that
// quarantines the table, naming the table and the column.
func (s *Sink) setPendingNotNull(ctx context.Context, tx pgx.Tx, id tidemark.TableID, qname string, t *targetTable) error {
	for _, c := range t.align.PendingNotNull {
		if _, ok := t.types[c]; !ok || t.notNull[c] {
			continue // dropped since, or set by the stream's evolution
		}
		stmt := "ALTER TABLE " + qname + " ALTER COLUMN " + tidemark.QuotePostgres(c) + " SET NOT NULL"
		s.log.Info("setting the NOT NULL of the source after the load", "table", qname, "source_table", id.String(), "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			if cerr := constraintFailed(id, qname, err); cerr != nil {
				return cerr
			}
			return fmt.Errorf("set NOT NULL on column %q of %s: %w", c, qname, err)
		}
	}
	t.align.PendingNotNull = nil
	return nil
}

// Plan returns the DDL the sink would run on the target for table t with
// secondary indexes idx: the schema and table when missing (then the
// indexes built after the first load), or what aligning the existing
// table to t and idx takes. It runs nothing: the catalog is read in a
// read-only transaction.
func (s *Sink) Plan(ctx context.Context, t *tidemark.Table, idx []tidemark.Index) ([]string, error) {
	d, _, err := s.def(t)
	if err != nil {
		return nil, err
	}
	var out []string
	err = s.retry(ctx, "plan "+d.display, func(ctx context.Context) error {
		out = nil
		return redact(pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			tt, err := readTarget(ctx, tx, d.qname)
			if err != nil {
				return d.wrap("read the target schema of", err)
			}
			a := alignmentOf(d.table)
			if !tt.exists {
				var schemaExists bool
				if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", d.schema).Scan(&schemaExists); err != nil {
					return d.wrap("look up schema of table", err)
				}
				if !schemaExists {
					out = append(out, "CREATE SCHEMA IF NOT EXISTS "+tidemark.QuotePostgres(d.schema))
				}
				out = append(out, d.createTableSQL)
				out = append(out, s.arbiterNotes(d, idx)...)
				tt.types = map[string]string{}
				for i, c := range d.table.Columns {
					tt.types[c.Name] = canonType(d.types[i])
				}
			} else {
				ev, err := d.evolve(tt, s.cfg.Schema, tidemark.Version{})
				if err != nil {
					return err
				}
				out = append(out, ev.stmts...)
				if tt.align != nil {
					a = tt.align
				}
				drops, err := deferredKeyConstraints(ctx, tx, d, tt)
				if err != nil {
					return err
				}
				for _, sp := range drops {
					out = append(out, sp.drop)
				}
			}
			if s.cfg.SkipIndexes {
				return nil
			}
			stmts, err := s.mirrorTx(ctx, tx, d.id, d.qname, tt, a, idx, true)
			out = append(out, stmts...)
			return err
		}), s.secret)
	})
	return out, redact(err, s.secret)
}

// constraintFailed turns the failure of a constraint on the target's rows
// (SET NOT NULL over a NULL, a unique index over duplicates) into the
// *tidemark.TableError that quarantines the table; nil for other errors.
func constraintFailed(id tidemark.TableID, target string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	var what string
	switch pgErr.Code {
	case "23502":
		what = fmt.Sprintf("column %q holds NULL in the target where the source declares NOT NULL", pgErr.ColumnName)
		if pgErr.ColumnName == "" {
			what = "a column holds NULL in the target where the source declares NOT NULL (" + pgErr.Message + ")"
		}
	case "23505", "23P01":
		what = fmt.Sprintf("rows of the target violate the mirrored unique index %q (%s)", pgErr.ConstraintName, pgErr.Message)
	default:
		return nil
	}
	return &tidemark.TableError{Table: id, Err: fmt.Errorf("target %s: %s: the target does not hold what the source does (resync the table): %w",
		target, what, tidemark.ErrIncompatibleSchema)}
}

// applyConstraintFailed maps a batch's failure on a mirrored constraint (a
// deferred unique check at commit, a NOT NULL) to the table it belongs to.
func applyConstraintFailed(err error, p *batchPlan) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.TableName == "" {
		return nil
	}
	for _, g := range p.groups {
		if g.def.schema == pgErr.SchemaName && g.def.name == pgErr.TableName {
			if pgErr.Code == "23505" && strings.HasSuffix(pgErr.ConstraintName, "_pkey") {
				return nil // the primary key: not a mirrored constraint
			}
			return constraintFailed(g.def.id, g.def.display, err)
		}
	}
	return nil
}
