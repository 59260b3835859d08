package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
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
	return fmt.Sprintf("the partition count of change topic %s changed from %d to %d while the tailer ran: rows would go to partitions without their schema record, and a key's changes to two partitions; stopping before publishing by the new count (stop the tailer, let every applier catch up, then start it again: it announces the schemas on every partition; docs/kafka.md)", e.topic, e.was, e.live)
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
