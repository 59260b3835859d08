package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
)

// Config configures a Sink. The zero value of every optional field is the
// documented default.
type Config struct {
	// Brokers are the seed brokers, "host:port". Required.
	Brokers []string
	// ClientID is the Kafka client id (default "tidemark").
	ClientID string
	// Security is TLS and SASL to the brokers (default plain text).
	Security Security

	// TopicPrefix fills {prefix} in TopicTemplate (default "tidemark").
	TopicPrefix string
	// TopicTemplate names the topic of a table's changes. It may use
	// {prefix}, {source}, {database} and {table} (default
	// "{prefix}.{database}.{table}"). Characters Kafka does not allow in a
	// topic name (anything but ASCII letters, digits, '.', '_' and '-') are
	// replaced by '_'; two tables that end up with the same topic are an
	// error naming both.
	TopicTemplate string
	// CheckpointTopic holds one record per batch: key = the source name,
	// value = the checkpoint (see docs/kafka.md). The sink creates it when
	// missing with one partition and cleanup.policy=compact, and always
	// writes and reads partition 0 (default TopicPrefix + ".checkpoints").
	CheckpointTopic string

	// Tombstones makes every delete publish a second record with the same
	// key and a null value, so that compacted topics forget deleted keys.
	// An update that changes the key then also publishes a tombstone for
	// the old key.
	Tombstones bool

	// ExactlyOnce publishes each batch's records and its checkpoint record
	// in one Kafka transaction (TransactionalID is then required). Without
	// it the sink uses the idempotent producer, waits for the batch's
	// records to be acknowledged and then writes the checkpoint record: a
	// crash in between republishes the batch on restart (at least once).
	ExactlyOnce bool
	// TransactionalID identifies this instance's producer across restarts
	// (required with ExactlyOnce). Starting a second instance with the same
	// id fences the first: its next Apply fails with ErrFenced.
	TransactionalID string
	// TransactionTimeout is how long the broker keeps a transaction open
	// before aborting it (default 60s). It bounds how long the checkpoint
	// of a crashed instance stays unreadable, and must exceed the time to
	// publish one batch.
	TransactionTimeout time.Duration
	// CommitResolveTimeout bounds how long the sink tries to learn the
	// outcome of a commit that got no answer (or was refused without a
	// fence) before it stops with "commit outcome unknown" (default 5m):
	// it must outlast a broker restart. Nothing is published meanwhile;
	// once the outcome is known, a batch that did not commit is published
	// again whole. When the context of Apply ends first, the sink still
	// tries for 30 s.
	CommitResolveTimeout time.Duration

	// CreateTopics makes the sink create a table's topic on first sight
	// (an existing topic is left as it is), with Partitions,
	// ReplicationFactor and TopicConfigs. Without it the topics must exist.
	CreateTopics bool
	// Partitions of a created topic (default -1: the broker's default).
	// Records of one key always go to one partition (murmur2 of the key,
	// as Kafka's Java client does), so changing the count later reorders
	// keys across partitions.
	Partitions int32
	// ReplicationFactor of created topics, including the checkpoint topic
	// (default -1: the broker's default).
	ReplicationFactor int16
	// TopicConfigs are set on created change topics, e.g.
	// {"cleanup.policy": "compact"} together with Tombstones.
	TopicConfigs map[string]string

	// MaxBufferedRecords bounds the records buffered in the producer
	// (default 10000). A full buffer blocks Apply, which blocks the
	// pipeline and the binlog reader behind it.
	MaxBufferedRecords int
	// MaxBufferedBytes bounds the bytes of the buffered records (default
	// 64 MiB), like MaxBufferedRecords. A single record larger than this
	// fails with MESSAGE_TOO_LARGE.
	MaxBufferedBytes int
	// MaxRecordBytes caps one produced record batch (default 1 MiB,
	// franz-go's). A change whose envelope is larger fails the batch with
	// MESSAGE_TOO_LARGE: raise this and the topics' max.message.bytes for
	// tables with large BLOB or TEXT columns.
	MaxRecordBytes int32

	// ControlRecords makes the sink announce each table's schema on every
	// partition of the table's topic before the first change written with
	// it (after a start, and after a schema change): a record with a
	// tm_control header (docs/kafka.md). `tidemark apply` needs them to
	// decode and create the target tables; consumers that do not know them
	// must skip records with a tm_control header.
	ControlRecords bool

	// AppliedOffsets, when set, returns the next offset the consumers of
	// the change topics (the apply group of the scale-out topology) will
	// read on each partition of topic (a partition missing from the map:
	// none stored, they start at the log start). With ControlRecords the
	// sink stores each change topic's partition count in its checkpoint
	// records; a count that differs from the stored one when the sink
	// first uses the topic (partitions added while the tailer was
	// stopped) is accepted only once these offsets show every committed
	// record of the old partitions consumed, waited for at most
	// PartitionChangeWait; otherwise Apply fails naming the topic and both
	// counts. Without it the stored count is not checked.
	AppliedOffsets func(ctx context.Context, topic string) (map[int32]int64, error)
	// PartitionChangeWait bounds the wait for AppliedOffsets (default
	// 60s).
	PartitionChangeWait time.Duration

	// SourceServerID is the source server's server_id, published in every
	// envelope's source.server_id (0: published as null).
	SourceServerID uint32

	// Retry is the backoff for a batch that failed with an error franz-go
	// does not retry itself but that aborting and republishing can fix (an
	// abortable transaction, a lost coordinator, a commit whose outcome had
	// to be read back). The zero value retries with the defaults of
	// tidemark.Backoff until ctx is done.
	Retry tidemark.Backoff
	// Logger receives the sink's and franz-go's log lines (franz-go's info
	// lines at debug level). Default slog.Default().
	Logger *slog.Logger

	// kgoOpts are extra client options (tests: faster retries).
	kgoOpts []kgo.Opt
}

// The defaults of Config.
const (
	// DefaultClientID is Config.ClientID's default.
	DefaultClientID = "tidemark"
	// DefaultTopicPrefix is Config.TopicPrefix's default.
	DefaultTopicPrefix = "tidemark"
	// DefaultTopicTemplate is Config.TopicTemplate's default.
	DefaultTopicTemplate = "{prefix}.{database}.{table}"
	// DefaultTransactionTimeout is Config.TransactionTimeout's default.
	DefaultTransactionTimeout = 60 * time.Second
	// DefaultCommitResolveTimeout is Config.CommitResolveTimeout's default.
	DefaultCommitResolveTimeout = 5 * time.Minute
	// DefaultMaxBufferedRecords is Config.MaxBufferedRecords's default.
	DefaultMaxBufferedRecords = 10000
	// DefaultMaxBufferedBytes is Config.MaxBufferedBytes's default.
	DefaultMaxBufferedBytes = 64 << 20
	// DefaultMaxRecordBytes is Config.MaxRecordBytes's default.
	DefaultMaxRecordBytes = 1 << 20
	// DefaultPartitionChangeWait is Config.PartitionChangeWait's default.
	DefaultPartitionChangeWait = 60 * time.Second
)

func (c Config) withDefaults() Config {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.TopicPrefix == "" {
		c.TopicPrefix = DefaultTopicPrefix
	}
	if c.TopicTemplate == "" {
		c.TopicTemplate = DefaultTopicTemplate
	}
	if c.CheckpointTopic == "" {
		c.CheckpointTopic = c.TopicPrefix + ".checkpoints"
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.CommitResolveTimeout == 0 {
		c.CommitResolveTimeout = DefaultCommitResolveTimeout
	}
	if c.Partitions == 0 {
		c.Partitions = -1
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = -1
	}
	if c.MaxBufferedRecords == 0 {
		c.MaxBufferedRecords = DefaultMaxBufferedRecords
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.MaxRecordBytes == 0 {
		c.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PartitionChangeWait == 0 {
		c.PartitionChangeWait = DefaultPartitionChangeWait
	}
	c.Security = c.Security.withDefaults()
	return c
}

// ValidateConfig checks cfg (with its defaults applied) without
// connecting. Errors are *ConfigError.
func ValidateConfig(cfg Config) error {
	return cfg.withDefaults().validate()
}

// ConfigError is an invalid Config field.
type ConfigError struct {
	// Field is the field's name in snake case ("brokers",
	// "transactional_id"), as in the YAML config.
	Field string
	// Problem says what is wrong.
	Problem string
}

// Error implements error.
func (e *ConfigError) Error() string {
	return "kafka sink config: " + e.Field + ": " + e.Problem
}

func cfgErr(field, format string, args ...any) error {
	return &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// validate checks c after withDefaults. Errors name the field.
func (c Config) validate() error {
	if len(c.Brokers) == 0 {
		return cfgErr("brokers", "required")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return cfgErr(fmt.Sprintf("brokers[%d]", i), "empty")
		}
	}
	if err := checkTemplate(c.TopicTemplate); err != nil {
		return cfgErr("topic_template", "%v", err)
	}
	if !validTopic(c.CheckpointTopic) {
		return cfgErr("checkpoint_topic", "%q is not a valid topic name (1 to 249 of [a-zA-Z0-9._-], not \".\" or \"..\")", c.CheckpointTopic)
	}
	if c.ExactlyOnce && c.TransactionalID == "" {
		return cfgErr("transactional_id", "required with exactly_once")
	}
	if err := c.Security.validate(); err != nil {
		return err
	}
	if c.TransactionTimeout < time.Second {
		return cfgErr("transaction_timeout", "must be at least 1s, got %s", c.TransactionTimeout)
	}
	if c.CommitResolveTimeout < time.Second {
		return cfgErr("commit_resolve_timeout", "must be at least 1s, got %s", c.CommitResolveTimeout)
	}
	if c.Partitions < -1 {
		return cfgErr("partitions", "must be positive or -1 (broker default), got %d", c.Partitions)
	}
	if c.ReplicationFactor < -1 {
		return cfgErr("replication_factor", "must be positive or -1 (broker default), got %d", c.ReplicationFactor)
	}
	if c.MaxBufferedRecords < 1 {
		return cfgErr("max_buffered_records", "must be positive, got %d", c.MaxBufferedRecords)
	}
	if c.MaxBufferedBytes < 1<<20 {
		return cfgErr("max_buffered_bytes", "must be at least 1 MiB, got %d", c.MaxBufferedBytes)
	}
	if c.MaxRecordBytes < 1<<10 || int(c.MaxRecordBytes) > c.MaxBufferedBytes {
		return cfgErr("max_record_bytes", "must be between 1 KiB and max_buffered_bytes, got %d", c.MaxRecordBytes)
	}
	if c.Retry.Attempts < 0 {
		return cfgErr("retry.attempts", "must not be negative, got %d", c.Retry.Attempts)
	}
	if c.ControlRecords {
		// Control records have a null key, which a compacted topic
		// refuses (INVALID_RECORD); and compaction removes the older
		// changes of a key that an applier still has to replay in
		// order with the control records.
		for _, p := range strings.Split(c.TopicConfigs["cleanup.policy"], ",") {
			if strings.TrimSpace(p) == "compact" {
				return cfgErr("topic_configs", "cleanup.policy compact cannot carry control records (the apply topology, control_records): they have no key, and compaction removes changes the appliers replay; use cleanup.policy delete with a retention longer than the appliers may lag")
			}
		}
	}
	return nil
}
