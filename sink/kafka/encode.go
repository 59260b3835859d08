package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
)

// encodedBatch is a batch's records, encoded once and republished as they
// are on every attempt. Keys and values live in one buffer.
type encodedBatch struct {
	buf  []byte
	recs []recSpec
	// shown is, per table, the codec whose schema the batch's records
	// leave last on the table's partitions (Sink.shown once published).
	shown map[tableKey]*codec
}

type recSpec struct {
	topic      string
	key        span
	value      span // value.end == -1: a tombstone (null value)
	op         []byte
	tableShape []byte
	// control: a control record (its kind: controlSchema, controlTruncate)
	// for partition, with value schema.
	control   []byte
	partition int32
	schema    []byte
}

type span struct{ start, end int }

// Header values shared by every record.
var (
	headerOp            = map[tidemark.Op][]byte{tidemark.OpInsert: []byte("c"), tidemark.OpUpdate: []byte("u"), tidemark.OpDelete: []byte("d"), tidemark.OpRead: []byte("r")}
	headerSchemaVersion = []byte(EnvelopeVersion)
)

// errRecordTooLarge is a change whose record cannot be produced.
var errRecordTooLarge = errors.New("record too large")

// recordBatchBytes is the size of a record batch holding one change record
// alone (key, value and the three headers records() gives it), as the
// producer counts it against max_record_bytes: the record batch header (61
// bytes) and the record with its varint lengths.
func recordBatchBytes(key, value, op, shape int) int {
	hdr := func(k, v int) int { return varintLen(k) + k + varintLen(v) + v }
	body := 1 + 1 + 1 + // attributes, timestamp delta 0, offset delta 0
		varintLen(key) + key + varintLen(value) + value +
		varintLen(3) + hdr(len("op"), op) + hdr(len("schema_version"), len(headerSchemaVersion)) + hdr(len("table_schema"), shape)
	return 61 + varintLen(body) + body
}

// varintLen is the length of n as a zigzag varint.
func varintLen(n int) int {
	u := uint64(n) << 1
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// records returns fresh kgo records for one attempt, with room for extra
// more at the end.
func (e *encodedBatch) records(extra int) []kgo.Record {
	recs := make([]kgo.Record, len(e.recs), len(e.recs)+extra)
	hdrs := make([]kgo.RecordHeader, 0, 3*len(e.recs))
	for i := range e.recs {
		r := &e.recs[i]
		if r.control != nil {
			n := len(hdrs)
			hdrs = append(hdrs,
				kgo.RecordHeader{Key: controlHeader, Value: r.control},
				kgo.RecordHeader{Key: "schema_version", Value: headerSchemaVersion},
				kgo.RecordHeader{Key: "table_schema", Value: r.tableShape})
			recs[i] = kgo.Record{Topic: r.topic, Partition: r.partition, Value: r.schema, Headers: hdrs[n:len(hdrs):len(hdrs)]}
			continue
		}
		recs[i] = kgo.Record{Topic: r.topic, Key: e.buf[r.key.start:r.key.end:r.key.end]}
		if r.value.end >= 0 {
			recs[i].Value = e.buf[r.value.start:r.value.end:r.value.end]
			n := len(hdrs)
			hdrs = append(hdrs,
				kgo.RecordHeader{Key: "op", Value: r.op},
				kgo.RecordHeader{Key: "schema_version", Value: headerSchemaVersion},
				kgo.RecordHeader{Key: "table_schema", Value: r.tableShape})
			recs[i].Headers = hdrs[n:len(hdrs):len(hdrs)]
		}
	}
	return recs
}

// encode builds the batch's records and counts them. It creates topics on
// first sight (when configured) and fails, naming the table and column, on a
// value that does not match its column's kind; nothing is published then.
// Callers hold s.mu.
func (s *Sink) encode(ctx context.Context, b *tidemark.Batch) (*encodedBatch, tidemark.ApplyStats, error) {
	var stats tidemark.ApplyStats
	// The buffer is sized by the previous batch's bytes per change, so
	// that it is not copied as it grows (issue 25's CPU profile).
	per := max(s.bytesPerChange, 256)
	enc := &encodedBatch{
		buf:  make([]byte, 0, per*len(b.Changes)+per/2*len(b.Changes)/8),
		recs: make([]recSpec, 0, len(b.Changes)),
	}
	tail, err := envelopeTail(b.Checkpoint, s.now())
	if err != nil {
		return nil, stats, fmt.Errorf("encode batch of %s: %w", b.Source, err)
	}
	codecs := map[*tidemark.Table]*codec{} // each table's fingerprint is computed once per batch
	var prev *codec                        // the previous change's
	for i := range b.Changes {
		ch := &b.Changes[i]
		if ch.Table == nil {
			return nil, stats, fmt.Errorf("encode change %d of batch: no table", i)
		}
		c, ok := codecs[ch.Table]
		if !ok {
			var err error
			if c, err = s.codec(ctx, b.Source, ch.Table); err != nil {
				return nil, stats, err
			}
			codecs[ch.Table] = c
		}
		if s.cfg.ControlRecords && c != prev {
			// The schema on every partition before any row written
			// with it, and again before rows of a layout the table's
			// partitions were shown another one after (a snapshot or
			// catch-up read beside the stream, a stream read again
			// after a reconnect): an applier writes a row only with
			// the schema last announced on its partition.
			k := tableKey{b.Source, ch.Table.ID}
			last, ok := enc.shown[k]
			if !ok {
				last = s.shown[k]
			}
			if last != c {
				n := s.partitions[c.topic]
				if n < 1 {
					return nil, stats, fmt.Errorf("announce schema of %s: topic %s has no known partitions", ch.Table.ID, c.topic)
				}
				if c.since == (tidemark.Version{}) {
					// The first change's version, or the layout's own
					// (tidemark.Table.Since) where it is above it: a
					// snapshot's rows carry the capture's version, and
					// a layout read again after a schema change during
					// the snapshot has rows at that same version; its
					// Since, above the binlog's end when it was read,
					// tells the appliers it is the newer layout.
					c.since = ch.Version
					if ch.Table.Since.Compare(c.since) > 0 {
						c.since = ch.Table.Since
					}
				}
				// Announced again, a layout keeps the version it was
				// first announced with: appliers never evolve a
				// target table to an older layout.
				schema := appendSchema(nil, c.sourceName, c.table, c.fingerprint, c.since, s.dropped[k])
				for p := int32(0); p < n; p++ {
					enc.recs = append(enc.recs, recSpec{topic: c.topic, control: controlSchema, partition: p, schema: schema, tableShape: c.fingerprint})
				}
				if enc.shown == nil {
					enc.shown = map[tableKey]*codec{}
				}
				enc.shown[k] = c
			}
		}
		prev = c
		op, ok := headerOp[ch.Op]
		if !ok {
			return nil, stats, fmt.Errorf("encode change of %s: unknown op %d", ch.Table.ID, ch.Op)
		}
		row := ch.After
		if ch.Op == tidemark.OpDelete || row == nil {
			row = ch.Before
		}
		var (
			r   = recSpec{topic: c.topic, op: op, tableShape: c.fingerprint}
			err error
		)
		r.key.start = len(enc.buf)
		if enc.buf, err = c.appendKey(enc.buf, row); err != nil {
			return nil, stats, err
		}
		r.key.end = len(enc.buf)
		r.value.start = len(enc.buf)
		if enc.buf, err = c.appendEnvelopeTail(enc.buf, ch, tail); err != nil {
			return nil, stats, err
		}
		r.value.end = len(enc.buf)
		if n := recordBatchBytes(r.key.end-r.key.start, r.value.end-r.value.start, len(r.op), len(c.fingerprint)); n > int(s.cfg.MaxRecordBytes) {
			// This table's problem only: it is quarantined, the other
			// tables go on (the producer would fail the whole batch
			// with MESSAGE_TOO_LARGE, again at every restart).
			return nil, stats, &tidemark.TableError{Table: ch.Table.ID, Err: fmt.Errorf("encode change of %s: its Kafka record is %d bytes, more than max_record_bytes %d (target.kafka.max_record_bytes; raise it, and the topic's max.message.bytes, for tables with large values): %w",
				ch.Table.ID, n, s.cfg.MaxRecordBytes, errRecordTooLarge)}
		}
		enc.recs = append(enc.recs, r)

		switch ch.Op {
		case tidemark.OpInsert, tidemark.OpRead:
			stats.Inserted++
		case tidemark.OpUpdate:
			stats.Updated++
		case tidemark.OpDelete:
			stats.Deleted++
		}
		if !s.cfg.Tombstones {
			continue
		}
		switch {
		case ch.Op == tidemark.OpDelete:
			enc.recs = append(enc.recs, recSpec{topic: c.topic, key: r.key, value: span{-1, -1}})
		case ch.Op == tidemark.OpUpdate && ch.Before != nil:
			// An update that changes the key: the old key is gone.
			start := len(enc.buf)
			if enc.buf, err = c.appendKey(enc.buf, ch.Before); err != nil {
				return nil, stats, err
			}
			old := span{start, len(enc.buf)}
			if bytes.Equal(enc.buf[old.start:old.end], enc.buf[r.key.start:r.key.end]) {
				enc.buf = enc.buf[:start]
				continue
			}
			enc.recs = append(enc.recs, recSpec{topic: c.topic, key: old, value: span{-1, -1}})
		}
	}
	if len(b.Changes) > 0 {
		s.bytesPerChange = len(enc.buf) / len(b.Changes)
	}
	return enc, stats, nil
}

// codec returns the encoding state of a table, building it (and resolving
// and maybe creating its topic) on first sight of its schema. Callers hold
// s.mu.
func (s *Sink) codec(ctx context.Context, source string, t *tidemark.Table) (*codec, error) {
	k := codecKey{source, t.ID, t.Fingerprint(), jsonUnknownOf(t)}
	if c, ok := s.codecs[k]; ok {
		return c, nil
	}
	topic, err := s.topicFor(ctx, source, t.ID)
	if err != nil {
		return nil, err
	}
	c, err := newCodec(t, source, topic, s.cfg.SourceServerID)
	if err != nil {
		return nil, err
	}
	s.codecs[k] = c
	return c, nil
}
