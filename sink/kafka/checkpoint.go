package kafka

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
)

// checkpoint is the value of a checkpoint record:
//
//	{"position":"gtid=0-1001-42","batch":"9f3c…-17",
//	 "watermarks":[{"database":"shop","table":"orders","value":"2026-11-29T10:00:00.123456789Z"}]}
//
// Position is tidemark.Position's String form ("" before the first
// transaction boundary); Batch identifies the producing transaction, so that
// a commit whose outcome was lost can be recognized when it is read back.
// Watermarks are the source's per-table catch-up watermarks (UTC, RFC 3339
// with nanoseconds), all of them in every record, sorted by table; omitted
// when there are none. Partitions (ControlRecords only, present even when
// empty) are the partition counts of the source's change topics that
// records were published by, all of them in every record, sorted by topic:
//
//	"partitions":[{"topic":"tidemark.shop.orders","count":12}]
//
// A record without it predates the field (or has no control records).
type checkpoint struct {
	Position   string       `json:"position"`
	Batch      string       `json:"batch"`
	Watermarks []watermark  `json:"watermarks,omitempty"`
	Partitions []topicCount `json:"partitions"`
}

type topicCount struct {
	Topic string `json:"topic"`
	Count int32  `json:"count"`
}

type watermark struct {
	Database string    `json:"database"`
	Table    string    `json:"table"`
	Value    time.Time `json:"value"`
}

// sourceState is what the sink knows is committed for a source.
type sourceState struct {
	pos   tidemark.Position
	marks map[tidemark.TableID]time.Time
	// parts are the partition counts of the source's change topics;
	// counted is false when the record carried none (an older record,
	// or no control records): the counts are then unknown.
	parts   map[string]int32
	counted bool
}

// withCounts returns st's partition counts with those of live (the counts
// the sink publishes by now) applied, as a new map.
func (st sourceState) withCounts(live map[string]int32) map[string]int32 {
	out := make(map[string]int32, len(st.parts)+len(live))
	maps.Copy(out, st.parts)
	maps.Copy(out, live)
	return out
}

// withWatermarks returns st's watermarks with ws applied (a watermark never
// moves backwards), as a new map.
func (st sourceState) withWatermarks(ws []tidemark.Watermark) map[tidemark.TableID]time.Time {
	if len(ws) == 0 {
		return st.marks
	}
	out := make(map[tidemark.TableID]time.Time, len(st.marks)+len(ws))
	maps.Copy(out, st.marks)
	for _, w := range ws {
		if old, ok := out[w.Table]; !ok || w.Value.After(old) {
			out[w.Table] = w.Value.UTC()
		}
	}
	return out
}

func newCheckpoint(st sourceState, batch string) checkpoint {
	c := checkpoint{Position: st.pos.String(), Batch: batch}
	for id, v := range st.marks {
		c.Watermarks = append(c.Watermarks, watermark{Database: id.Database, Table: id.Name, Value: v})
	}
	slices.SortFunc(c.Watermarks, func(a, b watermark) int {
		return cmp.Or(cmp.Compare(a.Database, b.Database), cmp.Compare(a.Table, b.Table))
	})
	if st.counted {
		c.Partitions = []topicCount{}
		for topic, n := range st.parts {
			c.Partitions = append(c.Partitions, topicCount{Topic: topic, Count: n})
		}
		slices.SortFunc(c.Partitions, func(a, b topicCount) int { return cmp.Compare(a.Topic, b.Topic) })
	}
	return c
}

func (c checkpoint) append(dst []byte) ([]byte, error) {
	var errs []error
	str := func(dst []byte, s string) []byte {
		out, err := appendString(dst, s)
		errs = append(errs, err)
		return out
	}
	dst = append(dst, `{"position":`...)
	dst = str(dst, c.Position)
	dst = append(dst, `,"batch":`...)
	dst = str(dst, c.Batch)
	if len(c.Watermarks) > 0 {
		dst = append(dst, `,"watermarks":[`...)
		for i, w := range c.Watermarks {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"database":`...)
			dst = str(dst, w.Database)
			dst = append(dst, `,"table":`...)
			dst = str(dst, w.Table)
			dst = append(dst, `,"value":"`...)
			dst = w.Value.UTC().AppendFormat(dst, time.RFC3339Nano)
			dst = append(dst, `"}`...)
		}
		dst = append(dst, ']')
	}
	if c.Partitions != nil {
		dst = append(dst, `,"partitions":[`...)
		for i, p := range c.Partitions {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"topic":`...)
			dst = str(dst, p.Topic)
			dst = append(dst, `,"count":`...)
			dst = strconv.AppendInt(dst, int64(p.Count), 10)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("encode checkpoint %s: %w", c.Position, err)
	}
	return append(dst, '}'), nil
}

func parseCheckpoint(source string, value []byte) (checkpoint, sourceState, error) {
	var c checkpoint
	if err := json.Unmarshal(value, &c); err != nil {
		return c, sourceState{}, fmt.Errorf("parse checkpoint record of %s: %w", source, err)
	}
	pos, err := tidemark.ParsePosition(c.Position)
	if err != nil {
		return c, sourceState{}, fmt.Errorf("parse checkpoint record of %s: %w", source, err)
	}
	st := sourceState{pos: pos, counted: c.Partitions != nil}
	for _, p := range c.Partitions {
		if st.parts == nil {
			st.parts = map[string]int32{}
		}
		st.parts[p.Topic] = p.Count
	}
	for _, w := range c.Watermarks {
		if st.marks == nil {
			st.marks = map[tidemark.TableID]time.Time{}
		}
		st.marks[tidemark.TableID{Database: w.Database, Name: w.Table}] = w.Value.UTC()
	}
	return c, st, nil
}

// checkpointPartitioner sends every record of the checkpoint topic to
// partition 0, where readCheckpoint looks for it, and partitions every other
// topic by key hash like Kafka's Java client (murmur2), so that the records
// of one key stay in order on one partition.
type checkpointPartitioner struct {
	topic string
	keyed kgo.Partitioner
	watch *partitionWatch
}

func newPartitioner(checkpointTopic string, watch *partitionWatch) kgo.Partitioner {
	return checkpointPartitioner{checkpointTopic, kgo.StickyKeyPartitioner(nil), watch}
}

func (p checkpointPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	if t == p.topic {
		return partitionZero{}
	}
	return controlPartitioner{p.keyed.ForTopic(t), t, p.watch}
}

// controlPartitioner sends a schema control record to the partition it
// names, and every other record where the keyed partitioner does. It
// reports to watch a count other than the topic's first one.
type controlPartitioner struct {
	keyed kgo.TopicPartitioner
	topic string
	watch *partitionWatch
}

func (controlPartitioner) RequiresConsistency(*kgo.Record) bool { return true }
func (p controlPartitioner) Partition(r *kgo.Record, n int) int {
	if p.watch != nil {
		_ = p.watch.check(p.topic, int32(n)) // the sink returns it before committing
	}
	if len(r.Headers) > 0 && r.Headers[0].Key == controlHeader {
		return int(r.Partition)
	}
	return p.keyed.Partition(r, n)
}

type partitionZero struct{}

func (partitionZero) RequiresConsistency(*kgo.Record) bool { return true }
func (partitionZero) Partition(*kgo.Record, int) int       { return 0 }

// readCheckpoint returns the newest committed checkpoint record of source
// on partition 0 of the checkpoint topic, and whether there is one.
//
// It scans backwards from the end in growing windows, reading each window up
// to the high watermark with read_uncommitted and control records kept, and
// decides itself which records committed: a transactional record counts
// once its producer's commit marker is read; records of aborted and of
// still-open transactions never count. This reads exactly up to the end
// (a read_committed consumer cannot tell where the last stable offset is
// when an aborted record precedes it). Every transaction of this sink writes
// one record to the partition, so a commit marker with no record of its
// producer in the window means the transaction began below the window: the
// window then grows. Compaction keeps the newest record of each source.
//
// A record of source of this sink's own producer, newer than the committed
// one, in a transaction still open makes the answer unknown: Kafka answers
// EndTxn before the coordinator has written the commit marker, so right
// after a commit the sink's own record is read as open (and on a new topic
// the read found "no checkpoint"). The read is then repeated until that
// transaction ends; one still open after openWait is an error naming it,
// never an older answer. Another producer's open transaction is left out as
// before: the daemon reads after Activate, which makes the broker finish the
// transaction an older instance of its id left.
func (s *Sink) readCheckpoint(ctx context.Context, source string) (checkpoint, sourceState, bool, error) {
	deadline := time.Now().Add(s.openWait())
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		c, st, ok, open, err := s.readCheckpointOnce(ctx, source)
		if err != nil || open == nil {
			return c, st, ok, err
		}
		if time.Now().After(deadline) {
			return checkpoint{}, sourceState{}, false, fmt.Errorf("read checkpoint of %s: its record at %s/0@%d is in a transaction (producer id %d) still open after %s: the checkpoint is unknown until that transaction ends",
				source, s.cfg.CheckpointTopic, open.Offset, open.ProducerID, s.openWait())
		}
		select {
		case <-ctx.Done():
			return checkpoint{}, sourceState{}, false, fmt.Errorf("read checkpoint of %s: waiting for the transaction of its record at %s/0@%d to end: %w", source, s.cfg.CheckpointTopic, open.Offset, ctx.Err())
		case <-time.After(pause):
		}
	}
}

// openWait bounds how long readCheckpoint waits for an open transaction.
func (s *Sink) openWait() time.Duration {
	if s.openWaitTest > 0 {
		return s.openWaitTest
	}
	return defaultOpenWait
}

// defaultOpenWait: a commit marker normally follows EndTxn within
// milliseconds; a transaction open longer is another writer's.
const defaultOpenWait = 15 * time.Second

// committedPID returns the producer id of the sink's last commit, if any.
func (s *Sink) committedPID() (int64, bool) {
	return s.lastPID, s.hasLastPID
}

// readCheckpointOnce is one read of readCheckpoint; open is the newest
// record of source in a still-open transaction, when it is newer than the
// committed one.
func (s *Sink) readCheckpointOnce(ctx context.Context, source string) (_ checkpoint, _ sourceState, _ bool, open *kgo.Record, _ error) {
	topic := s.cfg.CheckpointTopic
	starts, err := s.adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return checkpoint{}, sourceState{}, false, nil, fmt.Errorf("list start offset of %s: %w", topic, err)
	}
	ends, err := s.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return checkpoint{}, sourceState{}, false, nil, fmt.Errorf("list end offset of %s: %w", topic, err)
	}
	so, ok1 := starts.Lookup(topic, 0)
	eo, ok2 := ends.Lookup(topic, 0)
	if !ok1 || !ok2 {
		return checkpoint{}, sourceState{}, false, nil, fmt.Errorf("list offsets of %s: no partition 0", topic)
	}
	start, end := so.Offset, eo.Offset
	if end <= start {
		return checkpoint{}, sourceState{}, false, nil, nil
	}
	for window := int64(64); ; window *= 8 {
		lo := max(start, end-window)
		rec, open, orphan, err := s.scanCheckpoints(ctx, lo, end, source)
		if err != nil {
			return checkpoint{}, sourceState{}, false, nil, err
		}
		if (rec != nil && !orphan) || lo == start {
			if open != nil && (rec == nil || open.Offset > rec.Offset) {
				return checkpoint{}, sourceState{}, false, open, nil
			}
			if rec == nil {
				return checkpoint{}, sourceState{}, false, nil, nil
			}
			c, st, err := parseCheckpoint(source, rec.Value)
			if err != nil {
				return checkpoint{}, sourceState{}, false, nil, fmt.Errorf("read checkpoint at %s/0@%d: %w", topic, rec.Offset, err)
			}
			return c, st, true, nil, nil
		}
	}
}

// scanCheckpoints reads partition 0 of the checkpoint topic from lo up to
// end (exclusive) and returns the last committed record with key source.
// open is the record with key source of this sink's own producer (after a
// commit of its own) whose transaction is still open at end; orphan reports a commit marker whose transaction began below lo.
func (s *Sink) scanCheckpoints(ctx context.Context, lo, end int64, source string) (last, open *kgo.Record, orphan bool, err error) {
	// The records up to end exist, so this is quick unless the broker is
	// unreachable or the tail was removed (the caller retries).
	ctx, cancel := context.WithTimeout(ctx, scanTimeout)
	defer cancel()
	cl, err := s.rawLogClient(s.cfg.CheckpointTopic, map[int32]kgo.Offset{0: kgo.NewOffset().At(lo)})
	if err != nil {
		return nil, nil, false, fmt.Errorf("read checkpoint topic %s: %w", s.cfg.CheckpointTopic, err)
	}
	defer cl.Close()

	pending := map[int64]*kgo.Record{} // producer → its open transaction's record of source (or nil)
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, nil, false, fmt.Errorf("read checkpoint topic %s/0 from %d to %d: %w", s.cfg.CheckpointTopic, lo, end, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = fmt.Errorf("read checkpoint topic %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return nil, nil, false, ferr
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done || r.Offset >= end {
				done = true
				return
			}
			switch {
			case r.Attrs.IsControl():
				rec, open := pending[r.ProducerID]
				if !open {
					orphan = true
				}
				delete(pending, r.ProducerID)
				if rec != nil && controlType(r.Key) == controlCommit {
					last = rec
				}
			case r.Attrs.IsTransactional():
				if string(r.Key) == source {
					pending[r.ProducerID] = r
				} else if _, ok := pending[r.ProducerID]; !ok {
					pending[r.ProducerID] = nil
				}
			case string(r.Key) == source:
				last = r
			}
			if r.Offset >= end-1 {
				done = true
			}
		})
		if done {
			if own, ok := s.committedPID(); ok {
				open = pending[own]
			}
			return last, open, orphan, nil
		}
	}
}

// rawLogClient is a client that reads the given partitions of topic from
// the given offsets as they are in the log: records of every transaction
// (read_uncommitted) and the transaction markers.
func (s *Sink) rawLogClient(topic string, from map[int32]kgo.Offset) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID(s.cfg.ClientID),
		kgo.WithLogger(s.klog),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
	}, s.cfg.kgoOpts...)...)
}

// scanTimeout bounds one scan of the checkpoint topic.
const scanTimeout = 30 * time.Second

const (
	controlAbort  = 0
	controlCommit = 1
)

// controlType decodes the type of a control record's key (version int16,
// type int16), or -1.
func controlType(key []byte) int {
	if len(key) < 4 {
		return -1
	}
	return int(binary.BigEndian.Uint16(key[2:4]))
}
