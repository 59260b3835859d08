package tidemark

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ChunkSnapshotter reads a table's snapshot one key-range chunk at a time,
// so that the pipeline can snapshot a table beside the stream instead of
// inside its apply loop (PipelineConfig.Chunks, docs/SNAPSHOTS.md). Every
// chunk is one short read: no source transaction spans the table.
type ChunkSnapshotter interface {
	// Chunkable reports whether a table can be snapshotted in chunks: it
	// exists in the source and has a key to order the chunks by. Others
	// are snapshotted the old way, inside the apply loop.
	Chunkable(ctx context.Context, table TableID) (bool, error)
	// Parallelism is how many readers it has (snapshot.parallelism): up
	// to that many ranges are read at once, worker 0 … Parallelism()-1.
	Parallelism() int
	// Split divides a table into up to n disjoint ranges of its first key
	// column, in key order, covering every key (one range when n is 1,
	// the table is empty or its first key column cannot be split).
	Split(ctx context.Context, table TableID, n int) ([]SnapshotRange, error)
	// Capture captures the source position (SnapshotSource.Capture):
	// every transaction before its Version is visible to every read that
	// starts afterwards.
	Capture(ctx context.Context) (Snapshot, error)
	// ReadChunk reads up to one chunk of the range's rows in key order
	// after its cursor (After; nil: from the range's start), on reader
	// worker, as OpRead changes stamped with snap (taken before the read;
	// not necessarily just before). next is the range's cursor for its
	// following chunk, nil after its last one. Calls with different
	// workers may run at once.
	ReadChunk(ctx context.Context, table TableID, worker int, r SnapshotRange, snap Snapshot) (rows []Change, next []any, err error)
	// FinishSnapshot runs once the last chunk is applied: it creates the
	// target of a table that had no rows and mirrors the table's
	// secondary indexes. An error quarantines the table.
	FinishSnapshot(ctx context.Context, table TableID) error
}

// SnapshotRange is one reader's share of a table's snapshot: the rows
// whose first key column is in (From, To], read in key order after After.
type SnapshotRange struct {
	// From (exclusive) and To (inclusive) bound the first key column, one
	// value each, as the source compares it; nil is unbounded.
	From, To []any
	// After is the cursor in the range (the full key of the last row
	// read), nil before its first chunk.
	After []any
	// Done is set once the range's last chunk landed.
	Done bool
}

// rangesJSON is how EncodeRanges stores ranges (each value list in
// EncodeCursor's form).
type rangesJSON struct {
	Ranges []rangeJSON `json:"ranges"`
	// Target is the identity of the target table the ranges' rows landed
	// in (TargetIdentity) when they were stored; empty when unknown.
	Target string `json:"target,omitempty"`
}

type rangeJSON struct {
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	After string `json:"after,omitempty"`
	Done  bool   `json:"done,omitempty"`
}

// EncodeRanges encodes a snapshot's ranges and their progress for
// TableState.Cursor. A value of a type EncodeCursor cannot encode exactly
// is an error naming it.
func EncodeRanges(rs []SnapshotRange) (string, error) {
	return encodeRanges(rs, "")
}

// encodeRanges is EncodeRanges with the target table's identity.
func encodeRanges(rs []SnapshotRange, target string) (string, error) {
	out := rangesJSON{Target: target}
	enc := func(v []any) (string, error) {
		if v == nil {
			return "", nil
		}
		return EncodeCursor(v)
	}
	for _, r := range rs {
		var j rangeJSON
		var err error
		if j.From, err = enc(r.From); err != nil {
			return "", err
		}
		if j.To, err = enc(r.To); err != nil {
			return "", err
		}
		if j.After, err = enc(r.After); err != nil {
			return "", err
		}
		j.Done = r.Done
		out.Ranges = append(out.Ranges, j)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("encode snapshot ranges: %w", err)
	}
	return string(b), nil
}

// rangesTarget returns the target identity encodeRanges stored with
// ranges, "" when there is none (or s is not ranges).
func rangesTarget(s string) string {
	var in rangesJSON
	if !strings.HasPrefix(s, "{") || json.Unmarshal([]byte(s), &in) != nil {
		return ""
	}
	return in.Target
}

// DecodeRanges decodes what EncodeRanges returned, and the cursor of a
// single-range snapshot recorded before ranges existed (EncodeCursor's
// form: one range over the whole table). "" is no progress (nil).
func DecodeRanges(s string) ([]SnapshotRange, error) {
	if s == "" {
		return nil, nil
	}
	if !strings.HasPrefix(s, "{") {
		after, err := DecodeCursor(s)
		if err != nil {
			return nil, err
		}
		return []SnapshotRange{{After: after}}, nil
	}
	var in rangesJSON
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("decode snapshot ranges: %w", err)
	}
	if len(in.Ranges) == 0 {
		return nil, fmt.Errorf("decode snapshot ranges: no range")
	}
	out := make([]SnapshotRange, len(in.Ranges))
	for i, j := range in.Ranges {
		var err error
		if out[i].From, err = DecodeCursor(j.From); err != nil {
			return nil, fmt.Errorf("decode snapshot ranges: range %d: %w", i, err)
		}
		if out[i].To, err = DecodeCursor(j.To); err != nil {
			return nil, fmt.Errorf("decode snapshot ranges: range %d: %w", i, err)
		}
		if out[i].After, err = DecodeCursor(j.After); err != nil {
			return nil, fmt.Errorf("decode snapshot ranges: range %d: %w", i, err)
		}
		out[i].Done = j.Done
	}
	return out, nil
}

// EncodeCursor encodes a chunk cursor (the key values a source's Read
// returned) for TableState.Cursor. A value of a type it cannot encode
// exactly is an error naming it.
func EncodeCursor(after []any) (string, error) {
	parts := make([]string, len(after))
	for i, v := range after {
		switch x := v.(type) {
		case int64:
			parts[i] = "i:" + strconv.FormatInt(x, 10)
		case int32:
			parts[i] = "i:" + strconv.FormatInt(int64(x), 10)
		case int:
			parts[i] = "i:" + strconv.Itoa(x)
		case uint64:
			parts[i] = "u:" + strconv.FormatUint(x, 10)
		case uint32:
			parts[i] = "u:" + strconv.FormatUint(uint64(x), 10)
		case float64:
			parts[i] = "f:" + strconv.FormatFloat(x, 'g', -1, 64)
		case string:
			parts[i] = "s:" + x
		case []byte:
			parts[i] = "s:" + string(x)
		case time.Time:
			parts[i] = "t:" + x.Format(time.RFC3339Nano)
		default:
			return "", fmt.Errorf("encode chunk cursor: value %d is a %T", i, v)
		}
	}
	b, err := json.Marshal(parts)
	if err != nil {
		return "", fmt.Errorf("encode chunk cursor: %w", err)
	}
	return string(b), nil
}

// DecodeCursor decodes what EncodeCursor returned; "" is no cursor.
func DecodeCursor(s string) ([]any, error) {
	if s == "" {
		return nil, nil
	}
	var parts []string
	if err := json.Unmarshal([]byte(s), &parts); err != nil {
		return nil, fmt.Errorf("decode chunk cursor: %w", err)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		tag, val, ok := strings.Cut(p, ":")
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("no type")
		case tag == "i":
			out[i], err = strconv.ParseInt(val, 10, 64)
		case tag == "u":
			out[i], err = strconv.ParseUint(val, 10, 64)
		case tag == "f":
			out[i], err = strconv.ParseFloat(val, 64)
		case tag == "s":
			out[i] = val
		case tag == "t":
			out[i], err = time.Parse(time.RFC3339Nano, val)
		default:
			err = fmt.Errorf("unknown type %q", tag)
		}
		if err != nil {
			return nil, fmt.Errorf("decode chunk cursor: value %d: %w", i, err)
		}
	}
	return out, nil
}
