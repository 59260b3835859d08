package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"tidemark"
)

// The placeholders of Config.TopicTemplate.
var placeholders = []string{"{prefix}", "{source}", "{database}", "{table}"}

// checkTemplate rejects a template with an unknown placeholder or one that
// cannot give a valid topic name.
func checkTemplate(t string) error {
	rest := t
	for _, p := range placeholders {
		rest = strings.ReplaceAll(rest, p, "x")
	}
	if i := strings.IndexAny(rest, "{}"); i >= 0 {
		return fmt.Errorf("unknown placeholder in %q (want %s)", t, strings.Join(placeholders, ", "))
	}
	if !validTopic(sanitizeTopic(rest)) {
		return fmt.Errorf("%q cannot give a valid topic name", t)
	}
	return nil
}

// validTopic reports whether Kafka accepts name as a topic name.
func validTopic(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > maxTopicBytes {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !topicChar(name[i]) {
			return false
		}
	}
	return true
}

func topicChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// sanitizeTopic replaces every byte Kafka does not allow in a topic name by
// '_' (a multi-byte UTF-8 character becomes one '_' per byte).
func sanitizeTopic(s string) string {
	for i := 0; i < len(s); i++ {
		if !topicChar(s[i]) {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if !topicChar(b[j]) {
					b[j] = '_'
				}
			}
			return string(b)
		}
	}
	return s
}

// topicName fills the template for a table of a source. A name Kafka does
// not allow as it is (a non-ASCII letter, a space, '$') has each such byte
// replaced by '_' and gets a suffix: '-' and 8 hex digits of a hash of the
// name before the replacement, so that two tables whose names differ only
// in such characters ('жж' and 'ёё' both give "____") never share a topic.
// A name longer than Kafka's 249 bytes is refused, naming its length.
func (c *Config) topicName(source string, id tidemark.TableID) (string, error) {
	r := strings.NewReplacer("{prefix}", c.TopicPrefix, "{source}", source, "{database}", id.Database, "{table}", id.Name)
	full := r.Replace(c.TopicTemplate)
	name := sanitizeTopic(full)
	if name != full {
		h := fnv.New32a()
		h.Write([]byte(full))
		name += fmt.Sprintf("-%08x", h.Sum32())
	}
	if len(name) > maxTopicBytes {
		return "", fmt.Errorf("name topic of %s: template %q gives %q, which is %d bytes (Kafka allows %d): %w", id, c.TopicTemplate, name, len(name), maxTopicBytes, tidemark.ErrInvalidIdentifier)
	}
	if !validTopic(name) {
		return "", fmt.Errorf("name topic of %s: template %q gives %q, which is not a valid topic name: %w", id, c.TopicTemplate, name, tidemark.ErrInvalidIdentifier)
	}
	return name, nil
}

// maxTopicBytes is Kafka's limit on a topic name.
const maxTopicBytes = 249

// topicFor returns the topic of a table, checking that no two tables (and
// not the checkpoint topic) share it, and creating it on first sight when
// configured. Callers hold s.mu.
func (s *Sink) topicFor(ctx context.Context, source string, id tidemark.TableID) (string, error) {
	k := topicKey{source, id}
	if t, ok := s.topics[k]; ok {
		return t, nil
	}
	// A name that does not work is this table's problem only: a
	// *tidemark.TableError quarantines it, the other tables go on.
	name, err := s.cfg.topicName(source, id)
	if err != nil {
		return "", &tidemark.TableError{Table: id, Err: err}
	}
	if name == s.cfg.CheckpointTopic {
		return "", &tidemark.TableError{Table: id, Err: fmt.Errorf("name topic of %s: %q is the checkpoint topic: %w", id, name, tidemark.ErrInvalidIdentifier)}
	}
	if other, ok := s.topicOwner[name]; ok && other != k {
		return "", &tidemark.TableError{Table: id, Err: fmt.Errorf("name topic of %s: %q is also the topic of %s (source %s); change topic_template: %w", id, name, other.id, other.source, tidemark.ErrInvalidIdentifier)}
	}
	var n int32
	if s.cfg.CreateTopics {
		var err error
		if n, err = s.createTopic(ctx, name, s.cfg.Partitions, s.cfg.TopicConfigs); err != nil {
			return "", err
		}
	}
	if s.cfg.ControlRecords {
		if n < 1 {
			var err error
			if n, err = s.partitionCount(ctx, name); err != nil {
				return "", err
			}
		}
		if err := s.checkStoredCount(ctx, source, name, n); err != nil {
			return "", err
		}
		s.partitions[name] = n
		s.watch.expect(name, n)
	}
	s.topics[k] = name
	s.topicOwner[name] = k
	return name, nil
}

// partitionWatch holds the partition count each change topic had when the
// sink first used it (ControlRecords): schema and control records went to
// those partitions, and every key's changes by that count. The partitioner
// reports a record it places by another count (the client's metadata saw
// partitions added), and the sink stops before committing it.
type partitionWatch struct {
	mu   sync.Mutex
	want map[string]int32
	err  error // sticky
}

// partitionCountError is a change topic whose partition count changed
// while the sink ran.
type partitionCountError struct {
	topic     string
	was, live int32
}

func (e *partitionCountError) Error() string {
	return fmt.Sprintf("the partition count of change topic %s changed from %d to %d while the tailer ran: rows would go to partitions without their schema record, and a key's changes to two partitions; stopping before publishing by the new count (start the tailer again: it waits until the apply group has applied every record of the old partitions, then announces the schemas on every partition and publishes by the new count; docs/kafka.md)", e.topic, e.was, e.live)
}

// partitionChangeError is a change topic whose partition count is not the
// one stored in the checkpoint (or the checkpoint stores none), while the
// apply group has not applied every record of the old partitions.
type partitionChangeError struct {
	topic     string
	was, live int32 // was < 0: unknown
	behind    []string
	waited    time.Duration
}

func (e *partitionChangeError) Error() string {
	what := fmt.Sprintf("the partition count of change topic %s is %d, and was %d when the tailer last published to it (partitions added while the tailer was stopped, or while it ran)", e.topic, e.live, e.was)
	if e.was < 0 {
		what = fmt.Sprintf("the partition count of change topic %s is %d, and the checkpoint does not say which count the tailer published by (written by an older tidemark)", e.topic, e.live)
	}
	return fmt.Sprintf("%s: the apply group has not applied every record of the old partitions after waiting %s (%s), and publishing by the new count now would put a key's next changes on another partition before its earlier ones are applied; stopping before publishing by it (start the appliers, `tidemark apply`, let them catch up, then start the tailer again: it continues once they have; docs/kafka.md)",
		what, e.waited, strings.Join(e.behind, "; "))
}

// checkStoredCount compares the partition count n a change topic has when
// the sink first uses it with the count stored in source's checkpoint
// (ControlRecords, with AppliedOffsets). A different count (partitions
// added while the tailer was stopped, or a stop by partitionWatch), or
// none stored by a checkpoint older than the counts, is accepted once the
// apply group has applied every committed record of the old partitions
// (all of them when the old count is unknown): each key's earlier changes
// are then applied, and the next ones may go to another partition. It
// waits for that at most cfg.PartitionChangeWait, without s.mu: the
// sink's other callers (the pipeline's lock check reads the checkpoint)
// go on meanwhile. A topic that the stored counts do not name was never
// published to by this source. Callers hold s.mu; it is released while the
// group is asked and between the attempts, and held again on return.
func (s *Sink) checkStoredCount(ctx context.Context, source, topic string, n int32) error {
	if s.cfg.AppliedOffsets == nil {
		return nil
	}
	st, err := s.state(ctx, source)
	if err != nil {
		return err
	}
	was, known := st.parts[topic]
	if st.counted && (!known || was == n) {
		return nil
	}
	old := n
	if !known {
		was = -1
	} else {
		old = min(was, n)
	}
	deadline := time.Now().Add(s.cfg.PartitionChangeWait)
	s.mu.Unlock()
	defer s.mu.Lock()
	for logged := false; ; logged = true {
		behind, err := s.unapplied(ctx, topic, old)
		if err != nil {
			return fmt.Errorf("check partition count of %s: %w", topic, err)
		}
		if len(behind) == 0 {
			if known {
				s.log.Info("partition count of a change topic changed since the tailer last published to it; the apply group has applied every record of the old partitions: publishing by the new count",
					"topic", topic, "was", was, "now", n)
			}
			return nil
		}
		if !time.Now().Before(deadline) {
			return &partitionChangeError{topic: topic, was: was, live: n, behind: behind, waited: s.cfg.PartitionChangeWait}
		}
		if !logged {
			s.log.Info("partition count of a change topic changed since the tailer last published to it: waiting until the apply group has applied every record of the old partitions",
				"topic", topic, "was", was, "now", n, "unapplied", strings.Join(behind, "; "), "wait", s.cfg.PartitionChangeWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("check partition count of %s: %w", topic, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// unapplied returns the partitions 0..parts-1 of topic that hold committed
// records the apply group has not applied (cfg.AppliedOffsets), each as
// "partition P: next offset N, log end E". Transaction markers and aborted
// records are not records to apply: the partition's log from the group's
// next offset to its end is read (read_uncommitted, control records kept)
// and a record counts once its commit marker is read; a record whose
// transaction is still open counts too.
func (s *Sink) unapplied(ctx context.Context, topic string, parts int32) ([]string, error) {
	starts, err := s.adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list start offsets of %s: %w", topic, err)
	}
	ends, err := s.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	var next map[int32]int64
	var behind []string
	scan := map[int32]kgo.Offset{}
	end := map[int32]int64{}
	for p := range parts {
		so, ok1 := starts.Lookup(topic, p)
		eo, ok2 := ends.Lookup(topic, p)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("list offsets of %s: no partition %d", topic, p)
		}
		if eo.Offset <= so.Offset {
			continue // nothing in the log
		}
		if next == nil {
			if next, err = s.cfg.AppliedOffsets(ctx, topic); err != nil {
				return nil, fmt.Errorf("read the apply group's offsets of %s: %w", topic, err)
			}
		}
		at, ok := next[p]
		if !ok {
			at = so.Offset
		}
		switch {
		case at >= eo.Offset:
		case at < so.Offset || eo.Offset-at > maxUnappliedScan:
			behind = append(behind, fmt.Sprintf("partition %d: next offset %d, log start %d, end %d", p, at, so.Offset, eo.Offset))
		default:
			scan[p], end[p] = kgo.NewOffset().At(at), eo.Offset
		}
	}
	if len(scan) == 0 {
		return behind, nil
	}
	found, err := s.committedRecords(ctx, topic, scan, end)
	if err != nil {
		return nil, err
	}
	for p, off := range found {
		behind = append(behind, fmt.Sprintf("partition %d: next offset %d, a record to apply at %d, end %d", p, scan[p].EpochOffset().Offset, off, end[p]))
	}
	sort.Strings(behind)
	return behind, nil
}

// maxUnappliedScan bounds the log read by unapplied per partition: a
// group further behind is behind.
const maxUnappliedScan = 10000

// committedRecords reads each partition of topic from its offset in from
// up to end (exclusive) and returns, per partition, the offset of the
// first record that committed (or whose transaction is still open at end).
func (s *Sink) committedRecords(ctx context.Context, topic string, from map[int32]kgo.Offset, end map[int32]int64) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, scanTimeout)
	defer cancel()
	cl, err := s.rawLogClient(topic, from)
	if err != nil {
		return nil, fmt.Errorf("read change topic %s: %w", topic, err)
	}
	defer cl.Close()
	found := map[int32]int64{}
	pending := map[int32]map[int64]int64{} // partition → producer → its open transaction's first record
	end = maps.Clone(end)                  // a partition read to its end is removed
	left := len(from)
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read change topic %s up to its end: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			ferr = cmp.Or(ferr, fmt.Errorf("read change topic %s/%d: %w", t, p, err))
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			e, ok := end[r.Partition]
			if !ok || r.Offset >= e {
				return
			}
			open := pending[r.Partition]
			if open == nil {
				open = map[int64]int64{}
				pending[r.Partition] = open
			}
			switch {
			case r.Attrs.IsControl():
				if first, ok := open[r.ProducerID]; ok && controlType(r.Key) == controlCommit {
					if _, seen := found[r.Partition]; !seen {
						found[r.Partition] = first
					}
				}
				delete(open, r.ProducerID)
			case !r.Attrs.IsTransactional():
				if _, seen := found[r.Partition]; !seen {
					found[r.Partition] = r.Offset
				}
			default:
				if _, ok := open[r.ProducerID]; !ok {
					open[r.ProducerID] = r.Offset
				}
			}
			if r.Offset >= e-1 {
				for _, first := range open {
					if _, seen := found[r.Partition]; !seen || first < found[r.Partition] {
						found[r.Partition] = first
					}
				}
				delete(end, r.Partition)
				left--
			}
		})
	}
	return found, nil
}

func (w *partitionWatch) expect(topic string, n int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want[topic] = n
}

// check records an error when topic is watched with another count than n.
func (w *partitionWatch) check(topic string, n int32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if want, ok := w.want[topic]; ok && want != n && w.err == nil {
		w.err = &partitionCountError{topic: topic, was: want, live: n}
	}
	return w.err
}

func (w *partitionWatch) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// checkPartitionCounts compares, at most every 10 s, the live partition
// count of every change topic in use with the count it had when first used
// (the partitioner catches a record placed by a new count in between), and
// returns the error once one differs. Callers hold s.mu.
func (s *Sink) checkPartitionCounts(ctx context.Context) error {
	if err := s.watch.failed(); err != nil || len(s.partitions) == 0 || s.now().Sub(s.countsAt) < 10*time.Second {
		return err
	}
	names := make([]string, 0, len(s.partitions))
	for name := range s.partitions {
		names = append(names, name)
	}
	td, err := s.adm.ListTopics(ctx, names...)
	if err != nil {
		return nil // transient: the partitioner still watches, the next batch asks again
	}
	s.countsAt = s.now()
	for _, name := range names {
		if d, ok := td[name]; ok && d.Err == nil && len(d.Partitions) > 0 {
			if err := s.watch.check(name, int32(len(d.Partitions))); err != nil {
				return err
			}
		}
	}
	return nil
}

type topicKey struct {
	source string
	id     tidemark.TableID
}

// partitionCount returns the number of partitions of a topic, retrying
// transient errors (a topic just created may not be known yet). It asks a
// broker, never franz-go's metadata cache: the cache keeps the "unknown
// topic" answer of the existence check before a CreateTopics for
// MetadataMinAge (5 s), which every new table waited out in the retry loop
// (TestKafkaNewTopicPartitionsWithoutStaleMetadata).
func (s *Sink) partitionCount(ctx context.Context, name string) (int32, error) {
	var n int32
	err := tidemark.Retry(ctx, "describe topic "+name, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		var err error
		n, _, err = s.describePartitions(ctx, name)
		return err
	})
	return n, err
}

// describePartitions asks a broker for a topic's partition count and
// whether every partition has a leader.
func (s *Sink) describePartitions(ctx context.Context, name string) (n int32, led bool, err error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(name)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return 0, false, err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != name {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return 0, false, fmt.Errorf("describe topic %s: %w", name, err)
		}
		if len(t.Partitions) == 0 {
			break
		}
		led = true
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 || p.Leader < 0 {
				led = false
			}
		}
		return int32(len(t.Partitions)), led, nil
	}
	return 0, false, fmt.Errorf("describe topic %s: %w", name, kerr.UnknownTopicOrPartition)
}

// awaitLeaders waits (at most leaderWait) until every partition of a topic
// just created has a leader: the broker answers CreateTopics before, and
// a first produce to a partition without one is refused and waits for a
// metadata refresh and a retry backoff. Not waiting is not wrong, only
// slower (the producer retries), so it gives up quietly.
func (s *Sink) awaitLeaders(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(ctx, leaderWait)
	defer cancel()
	for {
		if _, led, err := s.describePartitions(ctx, name); err == nil && led {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// createTopic creates a topic unless it exists, retrying transient errors.
// An existing topic is left as it is. It returns the topic's partition
// count when the answer carried it (0: ask partitionCount).
func (s *Sink) createTopic(ctx context.Context, name string, partitions int32, configs map[string]string) (int32, error) {
	cfgs := make(map[string]*string, len(configs))
	for k, v := range configs {
		cfgs[k] = &v
	}
	var n int32
	err := tidemark.Retry(ctx, "create topic "+name, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		// Look first: creating needs a permission that using does not.
		if td, err := s.adm.ListTopics(ctx, name); err == nil && td.Has(name) {
			n = int32(len(td[name].Partitions))
			return nil
		}
		resp, err := s.adm.CreateTopic(ctx, partitions, s.cfg.ReplicationFactor, cfgs, name)
		if errors.Is(err, kerr.TopicAlreadyExists) {
			return nil
		}
		if err == nil {
			n = resp.NumPartitions
			s.awaitLeaders(ctx, name)
		}
		return err
	})
	return n, err
}

// HasTopic reports whether the topic of a table of source exists in the
// cluster: whether anything of the table may have been published (the
// scale-out tailer refuses a DROP TABLE only of a table the appliers may
// have).
// Published reports whether the topic of a table of source holds records
// (its log is not empty; aborted ones count too): whether its consumers
// may hold rows of the table. A catch-up of a table they may hold rows of
// must tell them which rows were deleted meanwhile.
func (s *Sink) Published(ctx context.Context, source string, id tidemark.TableID) (bool, error) {
	exists, err := s.HasTopic(ctx, source, id)
	if err != nil || !exists {
		return false, err
	}
	name, _ := s.cfg.topicName(source, id)
	starts, err := s.adm.ListStartOffsets(ctx, name)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return false, fmt.Errorf("list start offsets of %s: %w", name, err)
	}
	ends, err := s.adm.ListEndOffsets(ctx, name)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return false, fmt.Errorf("list end offsets of %s: %w", name, err)
	}
	held := false
	ends.Each(func(o kadm.ListedOffset) {
		if so, ok := starts.Lookup(name, o.Partition); !ok || o.Offset > so.Offset {
			held = true
		}
	})
	return held, nil
}

func (s *Sink) HasTopic(ctx context.Context, source string, id tidemark.TableID) (bool, error) {
	name, err := s.cfg.topicName(source, id)
	if err != nil {
		return false, nil // a table without a valid topic was never published
	}
	var exists bool
	err = tidemark.Retry(ctx, "look up topic "+name, s.cfg.Retry, retryable, s.rlog, func(ctx context.Context) error {
		td, err := s.adm.ListTopics(ctx, name)
		if err != nil {
			return err
		}
		d, ok := td[name]
		exists = ok && !errors.Is(d.Err, kerr.UnknownTopicOrPartition)
		if ok && d.Err != nil && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			return d.Err
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("look up topic %s of %s: %w", name, id, err)
	}
	return exists, nil
}
