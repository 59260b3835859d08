package kafka

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"tidemark"
)

// Schema control records (Config.ControlRecords). Before the first change
// of a table written with a schema, the sink writes to every partition of
// the table's topic, in the same batch (and transaction) as that change, a
// record with:
//
//	headers  tm_control=schema, schema_version, table_schema (the fingerprint hash)
//	key      null
//	value    {"control":"schema","source":"shop","database":"shop","table":"orders",
//	          "fingerprint":"9f3c2a1b7d5e4f60",
//	          "columns":[{"name":"id","kind":"int","bits":64,"precision":0,"scale":0,"nullable":false},…],
//	          "key":[0],"seq":4711,"index":1}
//
// A text column the source could not tell from JSON (MariaDB, a layout
// older than information_schema's, tidemark.Column.JSONUnknown) has
// "json_unknown":true; an applier's PostgreSQL sink resolves it from its
// target table.
//
// seq and index are the version of the change the record comes before:
// the partitions of a table reach a new layout at different times, and an
// applier never evolves the target table to an older layout than the one
// it has (tidemark.Table.Since).
//
// Records of one partition are read in order, so an applier always reads
// the schema before any row written with it: it creates or alters the
// target table first, and refuses a row whose table_schema header it has no
// schema for.

// controlHeader is the header key that marks a control record (always the
// first header); its value is the kind of control record.
const controlHeader = "tm_control"

var (
	controlSchema   = []byte("schema")
	controlTruncate = []byte("truncate")
	controlDrop     = []byte("drop")
	// snapshot boundaries (tidemark.SnapshotBoundary)
	controlSnapshotBegin = []byte("snapshot_begin")
	controlSnapshotEnd   = []byte("snapshot_end")
)

// A source TRUNCATE (PublishDDL) is a control record on every partition of
// the table's topic, with headers tm_control=truncate and schema_version:
//
//	{"control":"truncate","source":"shop","database":"shop","table":"orders","seq":4711,"index":0}
//
// An applier removes the target rows older than (seq, index) when it reads
// it (tidemark.StreamTarget.TruncateBefore): each partition's applier may
// run it, in any order, and the table converges.
//
// A source DROP TABLE (PublishDDL, with the drop applied by the tailer's
// configuration) is a control record of the same shape with
// tm_control=drop, and the reason when the table was renamed away or
// replaced:
//
//	{"control":"drop","source":"shop","database":"shop","table":"orders","seq":4712,"index":0,"reason":"renamed to shop.old_orders"}
//
// An applier removes the target rows older than (seq, index) and drops the
// target table when none is left (tidemark.StreamTarget.DropBefore); the
// partition then needs a schema record again before any row of the table
// (the sink announces it again after a drop).
type tableControl struct {
	Control  string `json:"control"`
	Source   string `json:"source"`
	Database string `json:"database"`
	Table    string `json:"table"`
	Seq      uint64 `json:"seq"`
	Index    uint32 `json:"index"`
	Reason   string `json:"reason,omitempty"`
}

// parseTableControl decodes a truncate or drop control record's value.
func parseTableControl(kind string, value []byte) (tableControl, error) {
	var rec tableControl
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, fmt.Errorf("decode %s record: %w", kind, err)
	}
	if rec.Control != kind || !tidemark.ValidIdentifier(rec.Database) || !tidemark.ValidIdentifier(rec.Table) {
		return rec, fmt.Errorf("decode %s record: not a %s of a valid table name", kind, kind)
	}
	return rec, nil
}

type schemaColumn struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Bits      int    `json:"bits"`
	Precision int    `json:"precision"`
	Scale     int    `json:"scale"`
	Nullable  bool   `json:"nullable"`
	// JSONUnknown (tidemark.Column.JSONUnknown): a text column the source
	// could not tell from JSON; only written when set.
	JSONUnknown bool `json:"json_unknown,omitempty"`
}

type schemaRecord struct {
	Control     string         `json:"control"`
	Source      string         `json:"source"`
	Database    string         `json:"database"`
	Table       string         `json:"table"`
	Fingerprint string         `json:"fingerprint"`
	Columns     []schemaColumn `json:"columns"`
	Key         []int          `json:"key"`
	// Seq and Index are the version of the first change the record
	// announces the layout for (tidemark.Table.Since): appliers never
	// evolve a target table to an older layout than it has.
	Seq   uint64 `json:"seq,omitempty"`
	Index uint32 `json:"index,omitempty"`
	// DropSeq and DropIndex are the version of the last DROP TABLE of
	// the table the tailer published before it (tidemark.Table.AfterDrop),
	// absent when it published none.
	DropSeq   uint64 `json:"drop_seq,omitempty"`
	DropIndex uint32 `json:"drop_index,omitempty"`
}

// appendSchema appends the schema control record's value for t, announced
// before a change at version since, after a DROP TABLE of the table at
// version dropped (zero: none).
func appendSchema(dst []byte, source string, t *tidemark.Table, fingerprint []byte, since, dropped tidemark.Version) []byte {
	rec := schemaRecord{Control: "schema", Source: source, Database: t.ID.Database, Table: t.ID.Name,
		Fingerprint: string(fingerprint), Key: t.Key, Columns: make([]schemaColumn, len(t.Columns)), Seq: since.Seq, Index: since.Index,
		DropSeq: dropped.Seq, DropIndex: dropped.Index}
	for i, c := range t.Columns {
		rec.Columns[i] = schemaColumn{Name: c.Name, Kind: c.Kind.String(), Bits: c.Bits, Precision: c.Precision, Scale: c.Scale, Nullable: c.Nullable, JSONUnknown: c.JSONUnknown}
	}
	b, _ := json.Marshal(rec) // strings, ints and bools only: cannot fail
	return append(dst, b...)
}

// announcedSchema is a schema read from a control record.
type announcedSchema struct {
	source      string
	table       *tidemark.Table
	fingerprint string
}

// parseSchema decodes a schema control record's value. Every error names
// what is wrong (never a value of a row: there are none).
func parseSchema(value []byte) (*announcedSchema, error) {
	var rec schemaRecord
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return nil, fmt.Errorf("decode schema record: %w", err)
	}
	if rec.Control != "schema" {
		return nil, fmt.Errorf("decode schema record: control %q, want schema", rec.Control)
	}
	id := tidemark.TableID{Database: rec.Database, Name: rec.Table}
	if err := tidemark.CheckIdentifier("database", rec.Database); err != nil {
		return nil, fmt.Errorf("decode schema record: %w", err)
	}
	if err := tidemark.CheckIdentifier("table", rec.Table); err != nil {
		return nil, fmt.Errorf("decode schema record: %w", err)
	}
	t := &tidemark.Table{ID: id, Key: rec.Key, Columns: make([]tidemark.Column, len(rec.Columns)), Since: tidemark.Version{Seq: rec.Seq, Index: rec.Index},
		AfterDrop: tidemark.Version{Seq: rec.DropSeq, Index: rec.DropIndex}}
	for i, c := range rec.Columns {
		if err := tidemark.CheckIdentifier("column of "+id.String(), c.Name); err != nil {
			return nil, fmt.Errorf("decode schema record: %w", err)
		}
		k, ok := kindByName(c.Kind)
		if !ok {
			return nil, fmt.Errorf("decode schema record of %s: column %s: unknown kind %q", id, c.Name, c.Kind)
		}
		if c.JSONUnknown && k != tidemark.KindText {
			return nil, fmt.Errorf("decode schema record of %s: column %s: json_unknown on a %s column (only text may be)", id, c.Name, k)
		}
		t.Columns[i] = tidemark.Column{Name: c.Name, Kind: k, Bits: c.Bits, Precision: c.Precision, Scale: c.Scale, Nullable: c.Nullable, JSONUnknown: c.JSONUnknown}
	}
	if len(t.Key) == 0 {
		return nil, fmt.Errorf("decode schema record of %s: no business key", id)
	}
	for _, k := range t.Key {
		if k < 0 || k >= len(t.Columns) {
			return nil, fmt.Errorf("decode schema record of %s: key column index %d out of range", id, k)
		}
	}
	return &announcedSchema{source: rec.Source, table: t, fingerprint: rec.Fingerprint}, nil
}

func kindByName(name string) (tidemark.Kind, bool) {
	for k := tidemark.KindInt; k <= tidemark.KindSet; k++ {
		if k.String() == name {
			return k, true
		}
	}
	return 0, false
}

// changeEnvelope is the part of a change envelope an applier needs.
type changeEnvelope struct {
	Op      string                     `json:"op"`
	Before  map[string]json.RawMessage `json:"before"`
	After   map[string]json.RawMessage `json:"after"`
	KeyOnly bool                       `json:"key_only"`
	Source  struct {
		Name       string  `json:"name"`
		Database   string  `json:"database"`
		Table      string  `json:"table"`
		CommitTime *string `json:"commit_time"`
		Seq        uint64  `json:"seq"`
		Index      uint32  `json:"index"`
	} `json:"source"`
}

var opByCode = map[string]tidemark.Op{"c": tidemark.OpInsert, "u": tidemark.OpUpdate, "d": tidemark.OpDelete, "r": tidemark.OpRead}

// decodeChangeJSON is decodeChange with encoding/json: the reference the
// fast decoder falls back to (decode.go).
func decodeChangeJSON(value []byte, t *tidemark.Table) (tidemark.Change, error) {
	var env changeEnvelope
	if err := json.Unmarshal(value, &env); err != nil {
		return tidemark.Change{}, fmt.Errorf("decode change of %s: %w", t.ID, err)
	}
	if env.Source.Database != t.ID.Database || env.Source.Table != t.ID.Name {
		return tidemark.Change{}, fmt.Errorf("decode change of %s: envelope names table %s.%s", t.ID, env.Source.Database, env.Source.Table)
	}
	op, ok := opByCode[env.Op]
	if !ok {
		return tidemark.Change{}, fmt.Errorf("decode change of %s: unknown op %q", t.ID, env.Op)
	}
	ch := tidemark.Change{Op: op, Table: t, Version: tidemark.Version{Seq: env.Source.Seq, Index: env.Source.Index}, Size: len(value),
		KeyOnly: env.KeyOnly && op == tidemark.OpDelete}
	if env.Source.CommitTime != nil {
		ct, err := time.Parse(time.RFC3339Nano, *env.Source.CommitTime)
		if err != nil {
			return tidemark.Change{}, fmt.Errorf("decode change of %s: commit_time: %w", t.ID, err)
		}
		ch.CommitTime = ct.UTC()
	}
	var err error
	if env.Before != nil {
		if ch.Before, err = decodeRow(env.Before, t); err != nil {
			return tidemark.Change{}, err
		}
	}
	if env.After != nil {
		if ch.After, err = decodeRow(env.After, t); err != nil {
			return tidemark.Change{}, err
		}
	}
	switch {
	case op == tidemark.OpDelete && ch.Before == nil, op != tidemark.OpDelete && ch.After == nil:
		return tidemark.Change{}, fmt.Errorf("decode change of %s: op %s without its row image", t.ID, env.Op)
	}
	return ch, nil
}

func decodeRow(obj map[string]json.RawMessage, t *tidemark.Table) ([]any, error) {
	if len(obj) != len(t.Columns) {
		return nil, fmt.Errorf("decode row of %s: %d columns, the schema has %d", t.ID, len(obj), len(t.Columns))
	}
	row := make([]any, len(t.Columns))
	for i := range t.Columns {
		col := &t.Columns[i]
		raw, ok := obj[col.Name]
		if !ok {
			return nil, fmt.Errorf("decode row of %s: column %s missing", t.ID, col.Name)
		}
		v, err := decodeValue(raw, col.Kind)
		if err != nil {
			return nil, &tidemark.ValueError{Table: t.ID, Column: col.Name, Detail: err.Error()}
		}
		row[i] = v
	}
	return row, nil
}

var errBadValue = errors.New("value does not match the column's kind")

// decodeValue is the inverse of appendValue.
func decodeValue(raw json.RawMessage, k tidemark.Kind) (any, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	str := func() (string, error) {
		if s, ok := plainString(raw); ok {
			return s, nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("kind %s: want a JSON string: %w", k, errBadValue)
		}
		return s, nil
	}
	switch k {
	case tidemark.KindInt, tidemark.KindYear:
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return v, nil
	case tidemark.KindUint, tidemark.KindBit:
		v, err := strconv.ParseUint(string(raw), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return v, nil
	case tidemark.KindFloat:
		v, err := strconv.ParseFloat(string(raw), 32)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return float32(v), nil
	case tidemark.KindDouble:
		v, err := strconv.ParseFloat(string(raw), 64)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return v, nil
	case tidemark.KindJSON:
		return tidemark.JSON(bytes.Clone(raw)), nil // raw may be the record's buffer
	}
	s, err := str()
	if err != nil {
		return nil, err
	}
	switch k {
	case tidemark.KindDecimal:
		return tidemark.Decimal(s), nil
	case tidemark.KindText, tidemark.KindEnum, tidemark.KindSet:
		return s, nil
	case tidemark.KindBytes:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return b, nil
	case tidemark.KindDate:
		d, err := time.Parse("2006-01-02", s)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return d, nil
	case tidemark.KindTime:
		return parseDuration(s)
	case tidemark.KindDateTime, tidemark.KindTimestamp:
		ts, err := parseTimestamp(s)
		if err != nil {
			return nil, fmt.Errorf("kind %s: %w", k, errBadValue)
		}
		return ts, nil
	}
	return nil, fmt.Errorf("unknown kind %s", k)
}

// parseDuration parses "[-]HH:MM:SS.ffffff" (appendDuration).
func parseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("kind time: %w", errBadValue)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	hms, frac, ok := strings.Cut(s, ".")
	parts := strings.Split(hms, ":")
	if !ok || len(parts) != 3 || len(frac) != 6 {
		return 0, bad
	}
	var n [4]int64
	for i, p := range append(parts, frac) {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil || v < 0 {
			return 0, bad
		}
		n[i] = v
	}
	d := time.Duration(((n[0]*60+n[1])*60+n[2])*1_000_000+n[3]) * time.Microsecond
	if neg {
		d = -d
	}
	return d, nil
}

// PublishDDL carries a source's schema changes to the appliers of the
// scale-out topology (ControlRecords is required): each TRUNCATE becomes a
// truncate control record and each DROP TABLE a drop control record on
// every partition of the table's topic, and the records commit with
// checkpoint (when not zero) like a batch, in one transaction with
// ExactlyOnce. Other operations publish nothing: an ALTER TABLE reaches the
// appliers as the schema record before the first row written with the new
// schema. The caller decides whether a DROP TABLE is applied (a refused one
// must not reach PublishDDL). After a drop, the next row of the table (a
// table created again under the name) is preceded by its schema record
// again. A replayed TRUNCATE or DROP is published again, which is harmless
// (TruncateBefore and DropBefore are idempotent).
func (s *Sink) PublishDDL(ctx context.Context, source string, events []tidemark.DDLEvent, checkpoint tidemark.Position) error {
	var recs []tableControl
	for _, ev := range events {
		rec := tableControl{Source: source, Database: ev.Table.Database, Table: ev.Table.Name, Seq: ev.Version.Seq, Index: ev.Version.Index}
		switch ev.Op {
		case tidemark.DDLTruncate:
			rec.Control = string(controlTruncate)
		case tidemark.DDLDropTable:
			rec.Control, rec.Reason = string(controlDrop), ev.Reason
		default:
			continue
		}
		recs = append(recs, rec)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.publishControl(ctx, source, recs, checkpoint); err != nil {
		return err
	}
	// Appliers forget a dropped table's schema: announce it again, with
	// the drop's version (tidemark.Table.AfterDrop).
	for _, rec := range recs {
		if rec.Control != string(controlDrop) {
			continue
		}
		k := tableKey{source, tidemark.TableID{Database: rec.Database, Name: rec.Table}}
		delete(s.shown, k)
		s.dropped[k] = tidemark.Version{Seq: rec.Seq, Index: rec.Index}
	}
	return nil
}

// BeginSnapshot implements tidemark.SnapshotBoundary: a snapshot_begin
// control record on every partition of the table's topic (ControlRecords
// is required), committed before it returns:
//
//	{"control":"snapshot_begin","source":"shop","database":"shop","table":"orders","seq":0,"index":0,"reason":"resync requested"}
//
// Appliers log it; the rows of the snapshot (op r) follow.
func (s *Sink) BeginSnapshot(ctx context.Context, source string, table tidemark.TableID, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.publishControl(ctx, source, []tableControl{{Control: string(controlSnapshotBegin), Source: source,
		Database: table.Database, Table: table.Name, Reason: reason}}, tidemark.Position{})
}

// EndSnapshot implements tidemark.SnapshotBoundary: a snapshot_end control
// record with the snapshot's version on every partition of the table's
// topic, committed before it returns:
//
//	{"control":"snapshot_end","source":"shop","database":"shop","table":"orders","seq":4711,"index":0}
//
// Each partition's applier, when it reaches it, removes the target rows
// older than (seq, index): the snapshot did not carry them
// (tidemark.StreamTarget.RemoveBefore).
func (s *Sink) EndSnapshot(ctx context.Context, source string, table tidemark.TableID, v tidemark.Version) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.publishControl(ctx, source, []tableControl{{Control: string(controlSnapshotEnd), Source: source,
		Database: table.Database, Table: table.Name, Seq: v.Seq, Index: v.Index}}, tidemark.Position{})
}

// publishControl publishes each record on every partition of its table's
// topic, with checkpoint (when not zero), like a batch: in one transaction
// with ExactlyOnce. Callers hold s.mu.
func (s *Sink) publishControl(ctx context.Context, source string, recs []tableControl, checkpoint tidemark.Position) error {
	if s.fenced != nil {
		return s.fenced
	}
	if !s.cfg.ControlRecords {
		return errors.New("publish control records: needs control_records")
	}
	if err := s.activate(ctx); err != nil {
		return err
	}
	if err := s.checkPartitionCounts(ctx); err != nil {
		return err
	}
	stored, err := s.state(ctx, source)
	if err != nil {
		return err
	}
	enc := &encodedBatch{}
	for _, rec := range recs {
		topic, err := s.topicFor(ctx, source, tidemark.TableID{Database: rec.Database, Name: rec.Table})
		if err != nil {
			return err
		}
		value, _ := json.Marshal(rec) // strings and integers only: cannot fail
		for p := int32(0); p < s.partitions[topic]; p++ {
			enc.recs = append(enc.recs, recSpec{topic: topic, control: []byte(rec.Control), partition: p, schema: value})
		}
	}
	if len(enc.recs) == 0 && checkpoint.IsZero() {
		return nil
	}
	b := &tidemark.Batch{Source: source, Checkpoint: checkpoint}
	if s.cfg.ExactlyOnce {
		err = s.publishTxn(ctx, b, enc, stored)
	} else {
		err = s.publish(ctx, b, enc, stored)
	}
	if err != nil && s.fenced != nil {
		return s.fenced
	}
	return err
}

var _ tidemark.SnapshotBoundary = (*Sink)(nil)
