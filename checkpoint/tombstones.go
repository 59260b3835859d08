package checkpoint

import (
	"context"
	"fmt"

	"tidemark"
)

// The hard-delete tombstones (what they are for, how they are written and
// pruned: sink/postgres/tombstones.go).
const (
	// tombstoneTable holds one row per hard delete: the target table,
	// the key, the delete's version, the source and its pruning
	// generation.
	tombstoneTable = "tombstones"
	// tombstoneStateTable holds each source's generation and the newest
	// checkpoint it stored (a checkpoint set back by hand does not make a
	// replay look like progress).
	tombstoneStateTable = "tombstone_state"
	// tombstoneHorizonTable holds, per target table, the newest version
	// of its pruned tombstones: a key without a row in the table counts as
	// deleted at that version.
	tombstoneHorizonTable = "tombstone_horizons"
)

// Tombstones returns the quoted name of the tombstone table.
func (s *Store) Tombstones() string { return s.tombstones }

// TombstoneState returns the quoted name of the tombstones' pruning state.
func (s *Store) TombstoneState() string { return s.tombstoneState }

// TombstoneHorizons returns the quoted name of the pruned tombstones'
// horizons.
func (s *Store) TombstoneHorizons() string { return s.tombstoneHorizons }

// InitTombstones creates the tombstone tables if they are missing, and the
// tombstones' (target, key) index. The PostgreSQL sink calls it after Init,
// in the same transaction, in hard-delete mode only.
func (s *Store) InitTombstones(ctx context.Context, q Querier) error {
	tomb := s.tombstones
	// Catalog reads, which take no lock: CREATE INDEX IF NOT EXISTS locks
	// the table before it finds the index there, so it would wait for any
	// open transaction that wrote a tombstone (and hold up every session
	// behind it). With everything in place nothing else runs.
	indexName := tidemark.QuotePostgres(s.schema) + "." + tidemark.QuotePostgres("tombstones_target_key")
	var exists, complete bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
	to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL AND to_regclass($4) IS NOT NULL`,
		tomb, s.tombstoneState, indexName, s.tombstoneHorizons).Scan(&exists, &complete); err != nil {
		return fmt.Errorf("look up %s: %w", tomb, err)
	}
	if complete {
		return nil
	}
	// The guard looks a key up (an applier's batches are always guarded)
	// and pruning in the apply topology goes by table.
	index := "CREATE INDEX IF NOT EXISTS tombstones_target_key ON " + tomb + " (target, key)"
	// Added after the other two: created in a control schema that has them.
	horizons := "CREATE TABLE IF NOT EXISTS " + s.tombstoneHorizons + ` (
	target text COLLATE "C" PRIMARY KEY, -- "schema"."table"
	seq bigint NOT NULL,                 -- the newest pruned tombstone's version
	idx integer NOT NULL
)`
	if exists {
		if err := q.Exec(ctx, index); err != nil {
			return fmt.Errorf("index %s: %w", tomb, err)
		}
		if err := q.Exec(ctx, horizons); err != nil {
			return fmt.Errorf("create %s: %w", s.tombstoneHorizons, err)
		}
		return nil
	}
	for _, sql := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + tidemark.QuotePostgres(s.schema),
		// No primary key: every delete writes a row; a replayed delete
		// adds a second row (pruned alike), which is cheaper than
		// INSERT … ON CONFLICT for every delete. The index on (target,
		// key) serves the guard of the apply topology, where every batch
		// is guarded, and its pruning by table (PruneTombstones).
		"CREATE TABLE IF NOT EXISTS " + tomb + ` (
	target text COLLATE "C" NOT NULL, -- "schema"."table" of the deleted row
	key text COLLATE "C" NOT NULL,    -- its business key (tombstoneSQL)
	seq bigint NOT NULL,              -- the delete's version
	idx integer NOT NULL,
	source text NOT NULL,
	gen bigint NOT NULL               -- pruning generation
)`,
		"CREATE TABLE IF NOT EXISTS " + s.tombstoneState + ` (
	source text PRIMARY KEY,
	gen bigint NOT NULL,    -- batches that moved the checkpoint forward
	newest text NOT NULL    -- the newest checkpoint stored
)`,
		index,
		horizons,
	} {
		if err := q.Exec(ctx, sql); err != nil {
			return fmt.Errorf("create %s: %w", tomb, err)
		}
	}
	return nil
}
