package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"tidemark"
	"tidemark/checkpoint"
)

// ddlTx runs fn in one transaction that holds the DDL lock (the
// transaction-level advisory lock on checkpoint.DDLLockKey, which the
// control tables' Init takes too) from its start: every
// change of a target table's layout, its alignment comment and the control
// tables is made under it, so concurrent sessions never race into unique
// violations (CREATE … IF NOT EXISTS) or read an alignment another is
// rewriting. The error is redacted.
func (s *Sink) ddlTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return redact(pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", checkpoint.DDLLockKey); err != nil {
			return fmt.Errorf("lock for DDL: %w", err)
		}
		return fn(tx)
	}), s.secret)
}

// ensureTx creates or evolves d's target table in tx (a ddlTx).
//
// directSafe is set when the direct insert path may be used: the target's
// primary key is the business key and is checked at once (not deferred), so
// a COPY of an existing key fails instead of adding a second row. proj is
// set when d is an older layout than the table's whose rows leave columns
// out (older.go). at is the version of a change written with d's layout
// (zero: none known), the layout's version when d.table.Since is zero
// (layoutVersion). load is set for the rows of a snapshot or catch-up
// (only OpRead): a NOT NULL the existing table lacks is recorded as pending
// in its alignment instead of set (the rows the load writes fill a column
// it adds), and MirrorIndexes sets it after the load. fresh is set for a
// fresh load's rows (tidemark.Batch.FreshLoad): a missing table is created
// without its primary key, which is built after the load (keyafter.go),
// and *keyless is set while the table has none; without fresh, a table
// still without its key gets it first.
func (s *Sink) ensureTx(ctx context.Context, tx pgx.Tx, d *tableDef, at tidemark.Version, load, fresh bool, directSafe, keyless *bool, proj **projection) error {
	oldest := at // the oldest version of the batch's rows of d
	at = layoutVersion(d, at)
	if err := s.freeTableName(ctx, tx, d); err != nil {
		return err
	}
	t, err := readTarget(ctx, tx, d.qname)
	if err != nil {
		return d.wrap("read the target schema of", err)
	}
	replaced := false
	if t.exists && t.align != nil && d.table.AfterDrop != (tidemark.Version{}) && s.cfg.Schema.DropTable == ApplyDDL &&
		t.align.since().Compare(d.table.AfterDrop) < 0 && !slices.Equal(alignedKey(t), d.table.KeyNames()) {
		// The table of this layout was created after a DROP TABLE that
		// the target's layout is older than, with another business key:
		// the target is the dropped table's, made again by a partition
		// that lags behind another's drop record (every row of it older
		// than the drop, which that partition's own drop record
		// removes). It is replaced, rather than refused as a changed
		// business key (nemesis 577059053311). With the same key it is
		// evolved as before: a gh-ost cut-over's table has the old
		// table's very layout, announced with the old layout's version,
		// and replacing it at each partition's first batch dropped the
		// rows the others had written (TestApplyOnlineSchemaChangeCutOver).
		s.log.Info("replacing a target table of the layout before a source DROP TABLE (its rows are older than the drop, which each partition's drop record removes)",
			"table", d.display, "source_table", d.id.String(), "target_layout", t.align.since().String(), "drop", d.table.AfterDrop.String())
		if _, err := tx.Exec(ctx, "DROP TABLE "+d.qname); err != nil {
			return d.wrap("drop table", err)
		}
		t.exists, replaced = false, true
	}
	if t.exists && t.align != nil && t.align.KeyPending {
		if fresh && freshFits(t, d) {
			// The fresh load goes on (a restart's, another range's).
			*directSafe, *keyless = true, true
			return nil
		}
		if err := s.buildKey(ctx, tx, d.id, d.qname, t); err != nil {
			return err
		}
	}
	if !t.exists {
		// A fresh load's table takes its primary key after the load; a
		// layout that knows the indexes (the stream's) never is one.
		fresh = fresh && !d.table.IndexesKnown
		if fresh && d.tomb != "" {
			// Tombstones of the table's keys at or after the load's
			// version (an earlier life of the target, dropped by hand
			// with the control tables kept) guard its rows, which only
			// the staged upsert checks: the key stays.
			top, err := s.tombMax(ctx, tx, d)
			if err != nil {
				return err
			}
			fresh = oldest != (tidemark.Version{}) && top.Compare(oldest) < 0
		}
		create := d.createTableSQL
		if fresh {
			create = d.createKeylessSQL
		}
		if err := d.createWith(ctx, tx, create); err != nil {
			return err
		}
		if err := d.resetHorizon(ctx, tx); err != nil {
			return err
		}
		a := alignmentOf(d.table)
		a.Seq, a.Idx = at.Seq, at.Index
		a.KeyPending = fresh
		if replaced && at.Compare(d.table.AfterDrop) < 0 {
			// Aligned at the drop at least: the next ensure of this
			// layout (another partition's) keeps the table it made.
			a.Seq, a.Idx = d.table.AfterDrop.Seq, d.table.AfterDrop.Index
		}
		if err := setAlignment(ctx, tx, d.qname, a); err != nil {
			return d.wrap("record the schema of", err)
		}
		// Created with the business key as primary key, or without one
		// for a fresh load (whose rows only the direct path writes).
		*directSafe, *keyless = true, fresh
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
	if olderLayout(at, t) {
		p, err := s.fitOlder(ctx, tx, d, at, t)
		*proj = p
		return err
	}
	policy := s.cfg.Schema
	policy.deferNotNull = load
	ev, err := d.evolve(t, policy, at)
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
	unloaded := 0
	if load {
		if unloaded, err = s.dropUniqueForLoad(ctx, tx, d, ev.align); err != nil {
			return err
		}
	}
	if t.align == nil || len(ev.stmts) > 0 || len(drops) > 0 || unloaded > 0 || !sameAlignment(t.align, ev.align) {
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
	before, held := maps.Clone(t.align.Indexes), t.align.UniqueAfter
	if _, err := s.mirrorTx(ctx, tx, d.id, d.qname, t, t.align, d.table.Indexes, false); err != nil {
		return err
	}
	if maps.Equal(before, t.align.Indexes) && sameHeld(held, t.align.UniqueAfter) {
		return nil
	}
	if err := setAlignment(ctx, tx, d.qname, t.align); err != nil {
		return d.wrap("record the indexes of", err)
	}
	return nil
}

// dropUniqueForLoad drops the mirrored unique constraints (UNIQUE and
// EXCLUDE: the alignment's "ALTER TABLE … ADD CONSTRAINT" entries) of the
// existing target table of d before a load writes into it, removes them
// from a and sets a.UniqueAfterLoad; it returns how many it dropped. A
// load that reads the whole table (a first run again after a deleted
// checkpoint or a purged binlog, a window catch-up) commits one chunk at a
// time, and a chunk may give a row the unique value that a stale target
// row still holds (the source moved it to another key since; that row is
// rewritten or removed later in the same load): checked at each chunk's
// commit, the constraint would fail on an intermediate state. The load's
// caller builds them again once every row is in (MirrorIndexes), where a
// violation means a target row the load did not rewrite, and quarantines
// the table. The primary key (the upserts' ON CONFLICT arbiter, the
// business key) stays; so do the non-unique indexes.
func (s *Sink) dropUniqueForLoad(ctx context.Context, tx pgx.Tx, d *tableDef, a *alignment) (int, error) {
	if a == nil {
		return 0, nil
	}
	if s.cfg.SkipIndexes {
		if a.UniqueAfter != nil {
			// A load again while the NOT NULL an earlier load deferred
			// waits for the stream: it waits for this load's end now.
			a.UniqueAfter = nil
			a.UniqueAfterLoad = true
		}
		return 0, nil
	}
	n := 0
	for _, name := range slices.Sorted(maps.Keys(a.Indexes)) {
		create := a.Indexes[name]
		if !strings.HasPrefix(create, "ALTER TABLE") {
			continue
		}
		stmt := dropFor(d.schema, d.qname, name, create)
		s.log.Info("dropping a mirrored unique constraint for a load into the table (built again after the load)",
			"table", d.display, "source_table", d.id.String(), "constraint", name, "ddl", stmt)
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return n, d.wrap("alter table", err)
		}
		if n == 0 {
			a.Indexes = maps.Clone(a.Indexes)
		}
		delete(a.Indexes, name)
		n++
	}
	if a.UniqueAfter != nil {
		// A load again while the constraints an earlier load dropped
		// wait for the stream: they wait for this load's end now.
		a.UniqueAfter = nil
		a.UniqueAfterLoad = true
	}
	if n > 0 {
		a.UniqueAfterLoad = true
		if len(a.Indexes) == 0 {
			a.Indexes = nil
		}
	}
	return n, nil
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
	s.clearKeyless(id) // ensured again before its next rows
}

// EnsureTable implements tidemark.TableRegistry.
func (s *Sink) EnsureTable(ctx context.Context, t *tidemark.Table) error {
	t, err := s.resolveTable(ctx, t) // jsonunknown.go
	if err != nil {
		return err
	}
	d, k, err := s.def(t)
	if err != nil {
		return err
	}
	if err := s.ensure(ctx, d, k, tidemark.Version{}, false, false); err != nil {
		return redact(err, s.secret)
	}
	return nil
}

// ensure creates or evolves d's target table in its own transaction, once
// per schema and process; at is the version of a change of the batch
// written with d's layout (zero: none), load that the batch's rows of d
// are a load's, see ensureTx.
func (s *Sink) ensure(ctx context.Context, d *tableDef, k defKey, at tidemark.Version, load, fresh bool) error {
	// A load ensures on its own (its ensureTx drops the mirrored unique
	// constraints): once per layout and process, and again after
	// MirrorIndexes built them (forgetTable). So does a fresh load (its
	// table may lack the primary key, which any other ensure builds).
	ek := k
	ek.load, ek.fresh = load, fresh
	if s.isEnsured(ek) {
		return nil
	}
	var directSafe, keyless bool
	var proj *projection
	err := tidemark.Retry(ctx, "prepare table "+d.display, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		directSafe, keyless, proj = false, false, nil
		return s.ddlTx(ctx, func(tx pgx.Tx) error {
			return s.ensureTx(ctx, tx, d, at, load, ek.fresh, &directSafe, &keyless, &proj)
		})
	})
	if err != nil {
		return err
	}
	if !keyless {
		// The key is there (built now, perhaps): no layout of the table
		// may go on as if it were not (a fresh load's cached ensure).
		s.forgetKeyless(k.id)
	}
	s.setDirect(k, directSafe, keyless)
	s.setProjection(k, proj)
	s.markEnsured(ek)
	return nil
}

// alignedKey is the business key the target table is aligned to.
func alignedKey(t *targetTable) []string {
	if t.align != nil && len(t.align.Key) > 0 {
		return t.align.Key
	}
	return t.key
}
