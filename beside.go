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
	// Capture captures the source position (SnapshotSource.Capture):
	// every transaction before its Version is visible to every read that
	// starts afterwards.
	Capture(ctx context.Context) (Snapshot, error)
	// ReadChunk reads up to one chunk of the table's rows in key order
	// after the cursor (nil: from the first key), as OpRead changes
	// stamped with snap (taken before the read; not necessarily just
	// before). next is the cursor of the following chunk, nil after the
	// last one.
	ReadChunk(ctx context.Context, table TableID, after []any, snap Snapshot) (rows []Change, next []any, err error)
	// FinishSnapshot runs once the last chunk is applied: it creates the
	// target of a table that had no rows and mirrors the table's
	// secondary indexes. An error quarantines the table.
	FinishSnapshot(ctx context.Context, table TableID) error
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
