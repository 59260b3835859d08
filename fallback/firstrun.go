package fallback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"tidemark"
)

// A first run (no checkpoint) records its progress in the table states
// (RunStreaming with a registry, docs/SNAPSHOTS.md "Restarts"), so that a
// first run killed mid-table resumes instead of redoing its catch-up:
//
//   - each table is recorded snapshotting when its read begins, with the
//     run's capture (position, version, source clock), its key columns,
//     whether a key diff follows its read, its watermark bound and its key
//     ranges; each range's cursor after the last chunk applied is written
//     at most every Config.ProgressEvery, and the table is marked done once
//     its read and key diff are in;
//   - a first run that finds such records resumes with their capture
//     instead of a new one: tables done are not read again, each range of
//     the table in progress is read after its cursor, tables not begun are
//     read in full; rows are stamped with the same version as before the
//     kill;
//   - at the end every recorded table is recorded streaming from the
//     capture's version, before the checkpoint (the capture's position) is
//     stored.
//
// Nothing is lost or doubled: every row the killed run applied and every
// row the resumed run reads was read after the one capture, and the stream
// resumes at its position, so every change after it — the deletes of rows
// already copied made while tidemark was down among them — is replayed
// over them and wins by version, as after an uninterrupted first run.
// Only rows the target held before the first run began (a table whose
// target had rows: its key diff was recorded) are not in the stream; the
// resumed table ends with its key diff then.
//
// Every write is a compare-and-set on the mode (SwapTableState): a state
// another process recorded meanwhile (a tidemark resync asked for during
// the first run, a quarantine) is kept, and that table's progress is no
// longer recorded.

// firstRunJSON is a first-run record in TableState.Cursor: the ranges in
// EncodeRanges' form beside the rest.
type firstRunJSON struct {
	FirstRun *captureJSON `json:"first_run"`
	// Key names the key columns the ranges and cursors are values of.
	Key []string `json:"key"`
	// KeyDiff: the table's read is followed by a key diff (its target
	// held rows when the read began).
	KeyDiff bool `json:"keydiff,omitempty"`
	// Fresh: the target held no rows of the table when the read began,
	// so every target row is this run's (a record without it: unknown).
	Fresh bool `json:"fresh,omitempty"`
	// Upper is the watermark the table's read commits (RFC 3339), empty
	// without one.
	Upper string `json:"upper,omitempty"`
	// Done: the read and the key diff are in.
	Done bool `json:"done,omitempty"`
	// Target is the target table's identity (tidemark.TargetIdentity)
	// when the record was written, empty before the table existed or when
	// the target cannot name it.
	Target string `json:"target,omitempty"`
}

// captureJSON is a recorded capture.
type captureJSON struct {
	Position string    `json:"position"`
	Seq      uint64    `json:"seq"`
	Index    uint32    `json:"idx"`
	Time     time.Time `json:"time"`
}

func captureOf(s tidemark.Snapshot) captureJSON {
	return captureJSON{Position: s.Position.String(), Seq: s.Version.Seq, Index: s.Version.Index, Time: s.ServerTime}
}

func (c captureJSON) snapshot() (tidemark.Snapshot, error) {
	pos, err := tidemark.ParsePosition(c.Position)
	if err != nil {
		return tidemark.Snapshot{}, err
	}
	if pos.IsZero() {
		return tidemark.Snapshot{}, errors.New("no position")
	}
	return tidemark.Snapshot{Position: pos, Version: tidemark.Version{Seq: c.Seq, Index: c.Index}, ServerTime: c.Time}, nil
}

// firstRunRecord is a decoded first-run record of a table.
type firstRunRecord struct {
	firstRunJSON
	ranges []tidemark.SnapshotRange
}

// decodeFirstRun returns st's first-run record, nil when st is none.
func decodeFirstRun(st tidemark.TableState) (*firstRunRecord, error) {
	if st.Mode != tidemark.TableSnapshotting || !strings.Contains(st.Cursor, `"first_run"`) {
		return nil, nil
	}
	var rec firstRunRecord
	if err := json.Unmarshal([]byte(st.Cursor), &rec.firstRunJSON); err != nil {
		return nil, fmt.Errorf("decode first-run record of %s: %w", st.Table, err)
	}
	if rec.FirstRun == nil {
		return nil, nil
	}
	var err error
	if rec.ranges, err = tidemark.DecodeRanges(st.Cursor); err != nil {
		return nil, fmt.Errorf("decode first-run record of %s: %w", st.Table, err)
	}
	return &rec, nil
}

// isFirstRunRecord reports whether st is a first run's progress.
func isFirstRunRecord(st tidemark.TableState) bool {
	rec, err := decodeFirstRun(st)
	return rec != nil || err != nil
}

// firstRun records one first run's progress in reg.
type firstRun struct {
	reg    tidemark.TableRegistry
	source string
	log    interface {
		Info(msg string, args ...any)
		Warn(msg string, args ...any)
	}
	snap tidemark.Snapshot
	// ident names the target tables the records are written against (nil:
	// the target cannot, and a record is trusted as it is).
	ident tidemark.TargetIdentity
	// every is Config.ProgressEvery.
	every time.Duration
	// resumed: snap is an interrupted first run's capture.
	resumed bool
	// prior is each table's recorded mode when the run began (the mode
	// its first write expects).
	prior map[tidemark.TableID]tidemark.TableMode
	// records are an interrupted first run's, resumed with its capture.
	records map[tidemark.TableID]*firstRunRecord

	mu      sync.Mutex
	written []tidemark.TableID // tables recorded snapshotting by a run
	// fresh: whether the target held no rows of a table when the run
	// first read it (targetFresh).
	fresh map[tidemark.TableID]bool
}

// openFirstRun reads the records an interrupted first run left in states
// and returns the run's recorder with their capture, or with a new one
// when there are none (or they cannot be used).
func (c *CatchUp) openFirstRun(ctx context.Context, reg tidemark.TableRegistry, states []tidemark.TableState) (*firstRun, error) {
	fr := &firstRun{reg: reg, source: c.cfg.Source, log: c.cfg.Logger, every: c.cfg.ProgressEvery,
		prior: map[tidemark.TableID]tidemark.TableMode{}, records: map[tidemark.TableID]*firstRunRecord{}}
	fr.ident, _ = c.keys.(tidemark.TargetIdentity)
	var capture *captureJSON
	var bad error
	for _, st := range states {
		fr.prior[st.Table] = st.Mode
		rec, err := decodeFirstRun(st)
		if err == nil && rec != nil && st.Floor != (tidemark.Version{Seq: rec.FirstRun.Seq, Index: rec.FirstRun.Index}) {
			err = fmt.Errorf("first-run record of %s: floor %s is not its capture's version", st.Table, st.Floor)
		}
		switch {
		case err != nil:
			bad = errors.Join(bad, err)
		case rec == nil:
			continue
		case capture == nil:
			capture = rec.FirstRun
		case *capture != *rec.FirstRun:
			bad = errors.Join(bad, fmt.Errorf("first-run record of %s has another capture (%s) than the others (%s)", st.Table, rec.FirstRun.Position, capture.Position))
		}
		if rec != nil {
			fr.records[st.Table] = rec
			fr.written = append(fr.written, st.Table)
		}
	}
	if capture != nil && bad == nil {
		snap, err := capture.snapshot()
		if err == nil {
			fr.snap, fr.resumed = snap, true
			c.cfg.Logger.Info("resuming an interrupted first-run snapshot with its capture: tables done are not read again, the others resume after their recorded cursors",
				"source", c.cfg.Source, "position", snap.Position.String(), "version", snap.Version.String(), "tables_recorded", len(fr.records))
			return fr, nil
		}
		bad = fmt.Errorf("first-run capture %q: %w", capture.Position, err)
	}
	if bad != nil {
		c.cfg.Logger.Warn("the records of an interrupted first-run snapshot cannot be resumed: starting it again with a new capture (every table read in full, a key diff where the target holds rows)",
			"source", c.cfg.Source, "err", bad)
	}
	clear(fr.records)
	snap, err := c.src.Capture(ctx)
	if err != nil {
		return nil, err
	}
	fr.snap = snap
	return fr, nil
}

// resumable returns the interrupted run's record of a table when it can
// be resumed: its key columns are still the table's.
func (fr *firstRun) resumable(tbl *tidemark.Table) *firstRunRecord {
	if fr == nil {
		return nil
	}
	fr.mu.Lock()
	rec := fr.records[tbl.ID]
	fr.mu.Unlock()
	if rec == nil {
		return nil
	}
	if !slices.Equal(rec.Key, keyNames(tbl)) {
		fr.log.Warn("the key of a table changed since its first-run snapshot was interrupted: reading it again in full", "table", tbl.ID.String(), "recorded_key", rec.Key, "key", keyNames(tbl))
		return nil
	}
	return rec
}

// sameTarget reports whether rec, the interrupted run's record of tbl, was
// written against the target table that holds tbl's rows now. A record
// without an identity is trusted: one written before the target table
// existed (no chunk of it applied since: nothing recorded past its
// start), or by a target that cannot name its tables. Otherwise the
// table must still exist with the recorded identity; a target table
// dropped, truncated or rewritten since (a user starting the target over
// by hand, tidemark's own tables kept) may have lost the rows the record
// counts.
func (fr *firstRun) sameTarget(ctx context.Context, tbl *tidemark.Table, rec *firstRunRecord) (bool, error) {
	if fr.ident == nil || rec.Target == "" {
		return true, nil
	}
	id, exists, err := fr.ident.TargetIdentity(ctx, tbl.ID)
	if err != nil {
		return false, fmt.Errorf("resume the first-run snapshot of %s: %w", tbl.ID, err)
	}
	if exists && id == rec.Target {
		return true, nil
	}
	fr.log.Warn("the target table of an interrupted first-run snapshot is not the one its progress was recorded against (dropped, truncated or rewritten since): reading the table again in full",
		"table", tbl.ID.String(), "recorded_target", rec.Target, "target", id, "exists", exists)
	return false, nil
}

// keyChanged returns the interrupted run's record of a table whose key
// columns are no longer the table's (a DROP + CREATE or a primary key
// changed after the run's capture), nil otherwise.
func (fr *firstRun) keyChanged(tbl *tidemark.Table) *firstRunRecord {
	if fr == nil {
		return nil
	}
	fr.mu.Lock()
	rec := fr.records[tbl.ID]
	fr.mu.Unlock()
	if rec == nil || slices.Equal(rec.Key, keyNames(tbl)) {
		return nil
	}
	return rec
}

// restart prepares a table's read to start again from its first chunk
// (a schema change during it): the interrupted run's record, if any, is
// not resumed, and the next write expects the state the read before wrote.
func (fr *firstRun) restart(id tidemark.TableID) {
	if fr == nil {
		return
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	delete(fr.records, id)
	if slices.Contains(fr.written, id) {
		fr.prior[id] = tidemark.TableSnapshotting
	}
}

func keyNames(tbl *tidemark.Table) []string {
	out := make([]string, len(tbl.Key))
	for i, k := range tbl.Key {
		out[i] = tbl.Columns[k].Name
	}
	return out
}

// track returns the progress of a table's first-run read (nil without a
// recorder): rec, when set, is the interrupted run's record it resumes.
func (fr *firstRun) track(tbl *tidemark.Table, keyDiff, fresh bool, wm *tidemark.Watermark, rec *firstRunRecord) *tableProgress {
	if fr == nil {
		return nil
	}
	fr.mu.Lock()
	p := &tableProgress{fr: fr, id: tbl.ID, mode: fr.prior[tbl.ID]}
	fr.mu.Unlock()
	capture := captureOf(fr.snap)
	p.rec.FirstRun = &capture
	p.rec.Key = keyNames(tbl)
	p.rec.KeyDiff = keyDiff
	p.rec.Fresh = fresh
	if wm != nil {
		p.rec.Upper = wm.Value.UTC().Format(time.RFC3339Nano)
	}
	if rec != nil {
		p.rec, p.ranges, p.resumed, p.mode = rec.firstRunJSON, rec.ranges, true, tidemark.TableSnapshotting
	}
	return p
}

// tableProgress is one table's recorded first-run progress.
type tableProgress struct {
	fr      *firstRun
	id      tidemark.TableID
	resumed bool

	mu      sync.Mutex
	rec     firstRunJSON
	ranges  []tidemark.SnapshotRange
	mode    tidemark.TableMode // the recorded mode the next write expects
	lost    bool               // another process recorded a state: no more writes
	savedAt time.Time
}

// freshLoad reports whether the table's chunks are a fresh load's
// (tidemark.Batch.FreshLoad): the target held no rows of it when the run
// first read it, no key diff follows, and no other process has recorded
// a state for it since (a resync, a quarantine: their writes follow).
func (p *tableProgress) freshLoad() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec.Fresh && !p.rec.KeyDiff && !p.lost
}

// begin records the table snapshotting with its ranges (a read not
// resumed).
func (p *tableProgress) begin(ctx context.Context, ranges []tidemark.SnapshotRange) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ranges = slices.Clone(ranges)
	return p.save(ctx)
}

// advance records that range i's chunk up to next (nil: its last) was
// applied; it is written when Config.ProgressEvery has passed since the
// last write.
func (p *tableProgress) advance(ctx context.Context, i int, next []any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if next == nil {
		p.ranges[i].Done = true
	} else {
		p.ranges[i].After = next
	}
	if time.Since(p.savedAt) < p.fr.every {
		return nil
	}
	return p.save(ctx)
}

// done records the table's read and key diff in.
func (p *tableProgress) done(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.ranges {
		p.ranges[i].Done = true
	}
	p.rec.Done = true
	return p.save(ctx)
}

// save writes the progress, called with p.mu held.
func (p *tableProgress) save(ctx context.Context) error {
	if p.lost {
		return nil
	}
	p.savedAt = time.Now()
	enc, err := tidemark.EncodeRanges(p.ranges)
	if err != nil {
		// A key of a type a cursor cannot hold exactly: the table is
		// read as before, without a record (a restart reads it again).
		p.lost = true
		p.fr.log.Info("the first-run progress of a table cannot be recorded: a restart reads it again in full", "table", p.id.String(), "err", err)
		return nil
	}
	if ti := p.fr.ident; ti != nil {
		id, exists, err := ti.TargetIdentity(ctx, p.id)
		if err != nil {
			return fmt.Errorf("record first-run progress of %s: %w", p.id, err)
		}
		if p.rec.Target = ""; exists {
			p.rec.Target = id
		}
	}
	cursor, err := p.encode(enc)
	if err != nil {
		return err
	}
	st := tidemark.TableState{Table: p.id, Mode: tidemark.TableSnapshotting, Reason: "first-run snapshot",
		Floor: p.fr.snap.Version, Cursor: cursor}
	ok, err := p.fr.reg.SwapTableState(ctx, p.fr.source, p.mode, st)
	if err != nil {
		return fmt.Errorf("record first-run progress of %s: %w", p.id, err)
	}
	if !ok {
		p.lost = true
		p.fr.log.Info("another state was recorded for a table during its first-run snapshot (a resync requested, a quarantine): it is kept, and the table's progress is no longer recorded",
			"table", p.id.String())
		return nil
	}
	if p.mode != tidemark.TableSnapshotting {
		p.mode = tidemark.TableSnapshotting
		p.fr.mu.Lock()
		if !slices.Contains(p.fr.written, p.id) {
			p.fr.written = append(p.fr.written, p.id)
		}
		p.fr.mu.Unlock()
	}
	return nil
}

// encode merges the record's fields into EncodeRanges' object.
func (p *tableProgress) encode(ranges string) (string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(ranges), &obj); err != nil {
		return "", fmt.Errorf("encode first-run progress of %s: %w", p.id, err)
	}
	rest, err := json.Marshal(p.rec)
	if err != nil {
		return "", fmt.Errorf("encode first-run progress of %s: %w", p.id, err)
	}
	if err := json.Unmarshal(rest, &obj); err != nil {
		return "", fmt.Errorf("encode first-run progress of %s: %w", p.id, err)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return "", fmt.Errorf("encode first-run progress of %s: %w", p.id, err)
	}
	return string(b), nil
}

// finish records every table the first run recorded streaming from its
// capture's version (those still snapshotting: a state another process
// recorded meanwhile is kept). It runs before the checkpoint is stored: a
// kill in between starts a new first run.
func (fr *firstRun) finish(ctx context.Context) error {
	if fr == nil {
		return nil
	}
	fr.mu.Lock()
	tables := slices.Clone(fr.written)
	fr.mu.Unlock()
	for _, id := range tables {
		st := tidemark.TableState{Table: id, Mode: tidemark.TableStreaming, Floor: fr.snap.Version}
		if _, err := fr.reg.SwapTableState(ctx, fr.source, tidemark.TableSnapshotting, st); err != nil {
			return fmt.Errorf("record %s streaming after the first-run snapshot: %w", id, err)
		}
	}
	return nil
}
