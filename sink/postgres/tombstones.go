package postgres

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"

	"tidemark"
)

// Hard-delete tombstones. A hard delete removes the row and its version,
// so a replay from an older checkpoint (the Fanout resumes from the oldest
// of its sinks' checkpoints; a transaction split across batches is replayed
// from its start) would find no row for an older insert or update of a
// deleted key to lose to, and would bring the row back until the replayed
// delete removed it again. Readers saw deleted rows come back.
//
// So every staged hard delete also writes a tombstone — the target table,
// the key (see tombstoneSQL), the delete's version — into
// <control schema>.tombstones (a table of the checkpoint package, like every
// control table) in the same transaction, and the staged
// upsert skips a row whose key has a newer tombstone. The direct insert
// path (direct.go) is taken only by rows newer than every tombstone of
// their table, and never by an applier's batch (one with stream offsets):
// the newest tombstone is cached per process, and the members of an apply
// group write each other's tombstones.
//
// Pruning. A tombstone is useful only against a replay that can carry an
// older change of its key: one that starts before the delete's transaction.
// Replays start at the oldest checkpoint of the sinks, which, when this
// sink applies a batch, is at least the checkpoint this sink stored with
// the previous batch (a Fanout applies a batch to every sink before the
// next one). The sink counts, per source, the batches that moved its
// checkpoint forward (gen) and stamps each tombstone with the count after
// its batch. The delete's transaction ends no later than the next
// checkpoint that moves forward (a batch's checkpoint stays at the last
// whole transaction; the transaction in progress ends at the next
// boundary), so once the count has moved past the tombstone's twice — a
// later checkpoint stored, then another batch applied — no replay can start
// before the delete: those tombstones are deleted at the start of that
// batch. The count and the newest checkpoint are stored (tombstone_state,
// same transaction): a replayed batch, after a restart or after the
// checkpoint was set back by hand, does not move the checkpoint forward
// (it is compared with the newest one ever stored), so nothing is pruned
// until the replay has passed it.
//
// Horizons. Pruning assumes that replays start at a stored checkpoint. One
// that starts before it — the checkpoint deleted to start over from
// source.start_position, or set back by hand past the pruned tombstones
// (docs/FAILOVER.md) — replays inserts of keys whose tombstones are gone,
// and brought them back until the replay reached their deletes again
// (nemesis seed 119). So pruning keeps, per target table, the newest
// version of the tombstones it removed: the table's horizon
// (tombstone_horizons). When a table's tombstones below H are pruned, the
// table has applied every change up to past H, so a key without a row in
// it was absent from the source there: a change at or below H of a key
// that has no row is older than the key's deletion and is skipped, as if
// the key's tombstone were at H. Stream changes are always newer than H
// (pruned tombstones are older than the stored checkpoint, or than every
// partition's floor in the apply topology), so only such replays meet it.
// Rows read by a snapshot or catch-up (Version.Index 0) are reads of the
// source, not replays, and are not held to it (a chunk read beside the
// stream may land after newer tombstones were pruned, into a table still
// being filled). A table the sink creates has no
// history: its horizon is removed with the CREATE (a target dropped to
// re-seed it, or a source DROP and CREATE TABLE).
//
// The tables (tombstones, tombstone_state: each source's generation and
// the newest checkpoint it stored, and tombstone_horizons) belong to the
// checkpoint package (checkpoint.Store.InitTombstones).

// tombSource is the pruning state of one source (see above).
type tombSource struct {
	gen    int64             // batches that moved the checkpoint forward
	ckpt   tidemark.Position // the newest checkpoint stored
	oldest int64             // the oldest generation stored (math.MaxInt64: none)
	top    int64             // the newest generation stored (-1: none)
}

// tombName returns the quoted tombstone table, "" in soft-delete mode.
func (c Config) tombName() string {
	if c.DeleteMode == DeleteSoft {
		return ""
	}
	return c.Checkpoints.Tombstones()
}

// horizonsName returns the quoted tombstone horizons, "" in soft-delete
// mode.
func (c Config) horizonsName() string {
	if c.DeleteMode == DeleteSoft {
		return ""
	}
	return c.Checkpoints.TombstoneHorizons()
}

// initTombstones creates the tombstone tables (hard-delete mode).
func (s *Sink) initTombstones(ctx context.Context, tx pgx.Tx) error {
	if s.cfg.tombName() == "" {
		return nil
	}
	return s.cfg.Checkpoints.InitTombstones(ctx, querier{tx})
}

var _ tidemark.TombstonePruner = (*Sink)(nil)

// PruneTombstones implements tidemark.TombstonePruner (the apply
// topology, whose batches carry no checkpoint to prune by): it removes
// table's tombstones older than below.
func (s *Sink) PruneTombstones(ctx context.Context, table tidemark.TableID, below tidemark.Version) (int64, error) {
	tomb := s.cfg.tombName()
	if tomb == "" || below == (tidemark.Version{}) {
		return 0, nil
	}
	_, _, qname, err := s.targetOf(table)
	if err != nil {
		return 0, err
	}
	if below.Seq > math.MaxInt64 || below.Index > math.MaxInt32 {
		return 0, fmt.Errorf("prune tombstones of %s: version %s does not fit", table, below)
	}
	// The newest pruned version raises the table's horizon, in the same
	// statement.
	var n int64
	err = s.pool.QueryRow(ctx, "WITH gone AS (DELETE FROM "+tomb+" WHERE target = $1 AND (seq, idx) < ($2, $3) RETURNING target, seq, idx),\n"+
		"raised AS ("+raiseHorizonsSQL(s.cfg.horizonsName())+")\nSELECT count(*) FROM gone", qname, int64(below.Seq), int32(below.Index)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("prune tombstones of %s: %w", table, redact(err, s.secret))
	}
	return n, nil
}

// tombBegin runs at the start of a batch's transaction (hard-delete mode):
// it loads the source's pruning state on first use, prunes the tombstones
// no replay can need any more, and returns the generation to stamp this
// batch's tombstones with and the state to remember once it commits.
//
// The state is stored only while it matters: when the batch deletes or
// tombstones are left. A source without deletes pays nothing per batch.
func (s *Sink) tombBegin(ctx context.Context, tx pgx.Tx, b *tidemark.Batch, deletes bool) (stamp int64, next *tombSource, err error) {
	tomb := s.cfg.tombName()
	if tomb == "" {
		return 0, nil, nil
	}
	state := s.cfg.Checkpoints.TombstoneState()
	s.mu.Lock()
	cur, ok := s.tombs[b.Source]
	s.mu.Unlock()
	if !ok {
		cur = &tombSource{}
		if err := tx.QueryRow(ctx, "SELECT COALESCE(min(gen), $2), COALESCE(max(gen), -1) FROM "+tomb+" WHERE source = $1", b.Source, int64(math.MaxInt64)).Scan(&cur.oldest, &cur.top); err != nil {
			return 0, nil, fmt.Errorf("read tombstones of source %q: %w", b.Source, err)
		}
		var newest string
		err := tx.QueryRow(ctx, "SELECT gen, newest FROM "+state+" WHERE source = $1", b.Source).Scan(&cur.gen, &newest)
		switch {
		case err == pgx.ErrNoRows:
			pos, has, err := s.cfg.Checkpoints.LoadPosition(ctx, querier{tx}, b.Source)
			if err != nil {
				return 0, nil, err
			}
			if has {
				cur.ckpt = pos
			}
		case err != nil:
			return 0, nil, fmt.Errorf("read tombstone state of source %q: %w", b.Source, err)
		default:
			if cur.ckpt, err = tidemark.ParsePosition(newest); err != nil {
				return 0, nil, fmt.Errorf("read tombstone state of source %q: %w", b.Source, err)
			}
		}
	}
	next = &tombSource{gen: cur.gen, ckpt: cur.ckpt, oldest: cur.oldest, top: cur.top}
	if !b.Checkpoint.IsZero() {
		forward := cur.ckpt.IsZero()
		if !forward {
			// An error (positions of different servers) counts as not
			// forward: tombstones are then kept longer, never dropped early.
			c, err := b.Checkpoint.Compare(cur.ckpt)
			forward = err == nil && c > 0
		}
		if forward {
			next.gen, next.ckpt = cur.gen+1, b.Checkpoint
		}
		if forward && (deletes || cur.oldest != math.MaxInt64) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+state+" (source, gen, newest) VALUES ($1, $2, $3) ON CONFLICT (source) DO UPDATE SET gen = EXCLUDED.gen, newest = EXCLUDED.newest",
				b.Source, next.gen, next.ckpt.String()); err != nil {
				return 0, nil, fmt.Errorf("store tombstone state of source %q: %w", b.Source, err)
			}
		}
		if forward {
			if cur.oldest < cur.gen {
				if _, err := tx.Exec(ctx, "WITH gone AS (DELETE FROM "+tomb+" WHERE source = $1 AND gen < $2 RETURNING target, seq, idx)\n"+
					raiseHorizonsSQL(s.cfg.horizonsName()), b.Source, cur.gen); err != nil {
					return 0, nil, fmt.Errorf("prune tombstones of source %q: %w", b.Source, err)
				}
				next.oldest = cur.gen
				if cur.top < cur.gen {
					next.oldest, next.top = math.MaxInt64, -1 // none left
				}
			}
		}
	}
	return next.gen, next, nil
}

// raiseHorizonsSQL raises the horizon of every target table of the pruned
// tombstones in gone (a WITH query's name: target, seq, idx) to the newest
// of them.
func raiseHorizonsSQL(horizons string) string {
	return "INSERT INTO " + horizons + " AS h (target, seq, idx)\n" +
		"SELECT DISTINCT ON (target) target, seq, idx FROM gone ORDER BY target, seq DESC, idx DESC\n" +
		"ON CONFLICT (target) DO UPDATE SET seq = EXCLUDED.seq, idx = EXCLUDED.idx WHERE (h.seq, h.idx) < (EXCLUDED.seq, EXCLUDED.idx)"
}

// horizonSQL is the part of the staged upsert's guard that holds a change
// to the table's horizon ($1 the target; see Horizons above): no horizon
// at or above the staged change's version while its key has no row in the
// target; rows read by a snapshot (index 0) pass. keys are the quoted key
// columns.
func horizonSQL(horizons, qname string, keys []string) string {
	conds := make([]string, len(keys))
	for i, k := range keys {
		conds[i] = "tk." + k + " = s." + k
	}
	seq, idx := tidemark.QuotePostgres(colSeq), tidemark.QuotePostgres(colIdx)
	return fmt.Sprintf(" AND NOT EXISTS (SELECT 1 FROM %s AS th WHERE th.target = $1 AND s.%s <> 0 AND (th.seq, th.idx) >= (s.%s, s.%s)\n"+
		"  AND NOT EXISTS (SELECT 1 FROM %s AS tk WHERE %s))", horizons, idx, seq, idx, qname, strings.Join(conds, " AND "))
}

// resetHorizon removes the horizon of a table the sink has just created in
// tx: it has no history a key's absence could stand for.
func (d *tableDef) resetHorizon(ctx context.Context, tx pgx.Tx) error {
	if d.horizons == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+d.horizons+" WHERE target = $1", d.qname); err != nil {
		return d.wrap("reset the tombstone horizon of", err)
	}
	return nil
}

// tombWritten records that a batch wrote tombstones stamped stamp.
func (t *tombSource) tombWritten(stamp int64) {
	t.oldest, t.top = min(t.oldest, stamp), max(t.top, stamp)
}

// tombCommitted records the pruning state of a committed batch.
func (s *Sink) tombCommitted(source string, next *tombSource) {
	if next == nil {
		return
	}
	s.mu.Lock()
	s.tombs[source] = next
	s.mu.Unlock()
}

// tombstoneSQL builds the statements of a hard-delete table: the guard the
// staged upsert adds (no newer tombstone of the key; $1 is the target
// name) and the tombstone write of the staged deletes ($1 target, $2
// source, $3 generation). The key is the text of a ROW of the key columns'
// texts (PostgreSQL quotes what needs it, so it is unambiguous), times in
// UTC so that the session's TimeZone cannot change it.
func tombstoneSQL(tomb, stage string, t *tidemark.Table) (guard, write, lock string) {
	var parts []string
	for _, k := range t.Key {
		c := &t.Columns[k]
		e := "s." + tidemark.QuotePostgres(c.Name)
		switch c.Kind {
		case tidemark.KindDateTime, tidemark.KindTimestamp:
			e = "to_char(" + e + " AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
		case tidemark.KindDate:
			e = "to_char(" + e + ", 'YYYY-MM-DD')"
		default:
			e += "::text"
		}
		parts = append(parts, e)
	}
	key := "ROW(" + strings.Join(parts, ", ") + ")::text"
	if len(parts) == 1 {
		key = parts[0] // one column: its text is unambiguous already
	}
	seq, idx := tidemark.QuotePostgres(colSeq), tidemark.QuotePostgres(colIdx)
	guard = fmt.Sprintf(" AND NOT EXISTS (SELECT 1 FROM %s AS tb WHERE tb.target = $1 AND tb.key = %s AND (tb.seq, tb.idx) > (s.%s, s.%s))",
		tomb, key, seq, idx)
	write = fmt.Sprintf("INSERT INTO %s (target, key, seq, idx, source, gen)\nSELECT $1, %s, s.%s, s.%s, $2, $3 FROM %s AS s WHERE s.%s IN ('%s', '%s')",
		tomb, key, seq, idx, stage, tidemark.QuotePostgres(colOp), opDelete, opKeyGone)
	// The guard reads the tombstones and the delete the target rows, each
	// in its own snapshot: two members' transactions on one key (a
	// key-changing UPDATE deletes its old key on the new key's partition
	// while the old key's partition writes an older change of it) would
	// each miss the other's uncommitted write and both commit, leaving
	// the deleted key in the target. So an applier's batch first locks
	// every staged key (transaction-scoped advisory locks, in order): the
	// second transaction waits for the first, and its statements, in new
	// snapshots, see the tombstone or the row. The keys are hashed into
	// keyStripes stripes (with the target's name), which bounds the locks
	// a transaction holds in PostgreSQL's shared lock table.
	lock = fmt.Sprintf("SELECT count(pg_advisory_xact_lock(%d, l.b)) FROM (SELECT DISTINCT hashtext($1 || %s) & %d AS b FROM %s AS s ORDER BY 1) AS l",
		keyLockClass, key, keyStripes-1, stage)
	return guard, write, lock
}

// keyLockClass is the first key of the advisory locks on staged keys
// ("tmky"); keyStripes the number of stripes (a power of two).
const (
	keyLockClass = 0x746d6b79
	keyStripes   = 512
)

// tombMax returns the newest tombstone version of a target table or its
// horizon, whichever is newer (zero: none), read once per table and raised
// as the sink writes more, so it is never below the table's newest
// tombstone or its horizon.
func (s *Sink) tombMax(ctx context.Context, tx pgx.Tx, d *tableDef) (tidemark.Version, error) {
	s.mu.Lock()
	v, ok := s.tombTop[d.qname]
	s.mu.Unlock()
	if ok {
		return v, nil
	}
	var seq int64
	var idx int32
	err := tx.QueryRow(ctx, "SELECT seq, idx FROM (SELECT seq, idx FROM "+d.tomb+" WHERE target = $1 UNION ALL SELECT seq, idx FROM "+d.horizons+
		" WHERE target = $1) AS v ORDER BY seq DESC, idx DESC LIMIT 1", d.qname).Scan(&seq, &idx)
	if err != nil && err != pgx.ErrNoRows {
		return v, fmt.Errorf("read tombstones of %s: %w", d.display, err)
	}
	if err == nil {
		v = tidemark.Version{Seq: uint64(seq), Index: uint32(idx)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.tombTop[d.qname]; ok && v.Compare(cur) < 0 {
		v = cur
	}
	s.tombTop[d.qname] = v
	return v, nil
}

// raiseTombMax raises the cached newest tombstone version of a table that
// has one cached (one not cached yet is read from the table when needed,
// which then holds the new tombstones too).
func (s *Sink) raiseTombMax(d *tableDef, v tidemark.Version) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.tombTop[d.qname]; ok && cur.Compare(v) < 0 {
		s.tombTop[d.qname] = v
	}
}
