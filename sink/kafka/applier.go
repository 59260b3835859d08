package kafka

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"tidemark"
)

// The applier is the consuming half of the scale-out topology (`tidemark
// apply`, docs/SCALE-OUT.md): a member of a consumer group that reads change
// topics written by the sink with ControlRecords and applies them to a
// tidemark.StreamTarget (the PostgreSQL sink) through its version guard.
//
// It lives in this package because it is the inverse of the sink: it reads
// the records the sink writes (envelope, schema control records, headers)
// and shares their codec; franz-go types stay inside the package, and
// cmd/tidemark wires it to the PostgreSQL sink through the root's
// StreamTarget interface.
//
// Exactly once. The position of every partition (the next offset, and the
// schema last announced on it) is stored in the target in the same
// transaction as the rows (tidemark.Batch.Offsets), as a compare-and-set on
// the offset this member read: Kafka's committed offsets are not used. On
// assignment the member starts each partition at the stored offset. A crash
// at any point leaves rows and offsets together; a member that lost a
// partition without noticing (a pause longer than the session timeout)
// fails its next commit with ErrOffsetMoved and re-reads its offsets.
// Rebalances are blocked while a batch is in flight (BlockRebalanceOnPoll):
// a revoked partition's batch is committed before the partition moves on.
// Records are read with read_committed.
//
// Control records (control.go) are applied in order with the rows of their
// partition, each after the rows before it have committed: a schema record
// creates or alters the target table, truncate and drop records remove the
// rows older than the statement (StreamTarget.TruncateBefore, DropBefore),
// and a snapshot's end record removes the rows its snapshot did not carry
// (RemoveBefore). For that every batch is applied with Batch.Refresh: a
// snapshot row takes the snapshot's version even when the target row has
// the same values.

// ApplierConfig configures an Applier.
type ApplierConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// ClientID is the Kafka client id (default "tidemark-apply").
	ClientID string
	// Security is TLS and SASL to the brokers (default plain text).
	Security Security
	// Group is the consumer group (and the key of the stored offsets).
	// Required.
	Group string
	// Topics is a regular expression of the change topics to consume,
	// e.g. `^shop\.` (anchor it). Required.
	Topics string
	// Exclude is a regular expression of topics not to consume although
	// Topics matches them (the checkpoint topic). Optional.
	Exclude string
	// Source is the name of the source whose topics the group applies: a
	// control record of another source is refused. Empty: not checked
	// (tidemark apply always sets it).
	Source string
	// TopicPrefix and TopicTemplate are the tailer's (Config): a control
	// record acts only on the table whose topic it was read from, so the
	// applier names the topic of the table a record names and refuses the
	// record when it is not the record's topic. Defaults as in Config.
	TopicPrefix, TopicTemplate string
	// MaxRecords bounds one batch (default 5000).
	MaxRecords int
	// MetadataMaxAge is how often topic metadata is refreshed, which is
	// how soon a new matching topic is consumed (default 10s).
	MetadataMaxAge time.Duration
	// Logger receives the applier's and franz-go's log lines (default
	// slog.Default()).
	Logger *slog.Logger
	// OnApply, if set, receives each committed batch's partitions and
	// counts (metrics).
	OnApply func(ApplyReport)

	kgoOpts []kgo.Opt
}

// ApplyReport is one committed batch of an Applier.
type ApplyReport struct {
	Batch   *tidemark.Batch
	Stats   tidemark.ApplyStats
	Records int
	Took    time.Duration
}

// PartitionStatus is an assigned partition of an Applier.
type PartitionStatus struct {
	Topic     string
	Partition int32
	// Next is the offset of the next record to apply (committed in the
	// target); HighWatermark the partition's end when last fetched (-1:
	// not fetched yet).
	Next, HighWatermark int64
	// Records counts the records this member applied from the partition.
	Records int64
	// Table is the table whose schema was last announced on the
	// partition ("" before any).
	Table string
	// Stopped is why the partition stopped at Next ("" while it runs).
	Stopped string
}

// Lag is HighWatermark − Next, or -1 when unknown.
func (p PartitionStatus) Lag() int64 {
	if p.HighWatermark < 0 {
		return -1
	}
	return max(p.HighWatermark-p.Next, 0)
}

// Applier is one member of an apply group. Run it once.
type Applier struct {
	cfg    ApplierConfig
	target tidemark.StreamTarget
	cl     *kgo.Client
	adm    *kadm.Client
	log    *slog.Logger

	topics Config // TopicPrefix and TopicTemplate: topicName

	mu       sync.Mutex
	counts   map[string]int // partition count of each topic when last assigned
	prunedAt time.Time      // when tombstones were last pruned
	parts    map[topicPartition]*partState
	schemas  map[string]*announcedSchema // by value of the control record: one *Table per schema
}

type topicPartition struct {
	topic     string
	partition int32
}

type partState struct {
	prev    int64 // Next stored in the target (-1: no row)
	next    int64 // offset after the last record read into the batch
	hw      int64
	records int64
	topicID string // the topic's id, stored with the offset
	epoch   int32  // leader epoch of the record before next (-1: unknown)
	// floor is the newest version of a streamed change applied from the
	// partition (tidemark.StreamOffset.Floor), stored with next.
	floor  tidemark.Version
	schema *announcedSchema
	json   string // the schema record's value, stored with the offset
	// quarantined is why the partition's table is quarantined ("": it
	// is not): its rows and control records are skipped, the offsets
	// advance, until the partition's next snapshot_begin of the table (a
	// resync) starts applying it again.
	quarantined string
	// stopped is why the partition stopped (nil: it runs): the record at
	// next cannot be applied safely. The partition is paused until it is
	// revoked; every other partition goes on.
	stopped error
}

// NewApplier validates cfg and creates the group member; it joins the
// group when Run polls.
func NewApplier(cfg ApplierConfig, target tidemark.StreamTarget) (*Applier, error) {
	if cfg.ClientID == "" {
		cfg.ClientID = "tidemark-apply"
	}
	if cfg.MaxRecords == 0 {
		cfg.MaxRecords = 5000
	}
	if cfg.MetadataMaxAge == 0 {
		cfg.MetadataMaxAge = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case len(cfg.Brokers) == 0:
		return nil, cfgErr("brokers", "required")
	case cfg.Group == "":
		return nil, cfgErr("group", "required")
	case cfg.Topics == "":
		return nil, cfgErr("topics", "required (a regular expression of change topics)")
	case cfg.MaxRecords < 1:
		return nil, cfgErr("max_records", "must be positive, got %d", cfg.MaxRecords)
	}
	if _, err := regexp.Compile(cfg.Topics); err != nil {
		return nil, cfgErr("topics", "%v", err)
	}
	if _, err := regexp.Compile(cfg.Exclude); err != nil {
		return nil, cfgErr("exclude", "%v", err)
	}
	topics := Config{TopicPrefix: cfg.TopicPrefix, TopicTemplate: cfg.TopicTemplate}.withDefaults()
	if err := checkTemplate(topics.TopicTemplate); err != nil {
		return nil, cfgErr("topic_template", "%v", err)
	}
	a := &Applier{cfg: cfg, target: target, log: cfg.Logger.With("component", "apply", "group", cfg.Group),
		topics: topics, counts: map[string]int{}, parts: map[topicPartition]*partState{}, schemas: map[string]*announcedSchema{}}
	klog := kgoLogger{l: a.log.With("lib", "franz-go")}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.WithLogger(klog),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeRegex(),
		kgo.ConsumeTopics(cfg.Topics),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.BlockRebalanceOnPoll(),
		kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Never jump over records: a fetch out of range (retention,
		// deleted records, a truncated log) is returned as an error and
		// stops the partition (Run).
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.MetadataMaxAge(cfg.MetadataMaxAge),
		kgo.OnPartitionsAssigned(a.onAssigned),
		kgo.AdjustFetchOffsetsFn(a.adjustOffsets),
		kgo.OnPartitionsRevoked(a.onRevoked),
		kgo.OnPartitionsLost(a.onRevoked),
	}
	if cfg.Exclude != "" {
		opts = append(opts, kgo.ConsumeExcludeTopics(cfg.Exclude))
	}
	cfg.Security = cfg.Security.withDefaults()
	sec, err := cfg.Security.opts()
	if err != nil {
		return nil, err
	}
	opts = append(append(opts, sec...), cfg.kgoOpts...)
	// The group's callbacks run on franz-go's goroutines as soon as the
	// client exists: adjustOffsets (under a.mu) reads a.adm. Both are set
	// under a.mu, so that a callback that comes first waits for them (CI
	// at bfa97a9: a data race in TestApplierFollowsSnapshotBoundaries).
	a.mu.Lock()
	defer a.mu.Unlock()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create applier: %w", err)
	}
	a.cl = cl
	a.adm = kadm.NewClient(cl)
	return a, nil
}

func (a *Applier) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	a.log.Info("partitions assigned", "partitions", fmt.Sprint(sortedParts(assigned)))
}

func (a *Applier) onRevoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resume := map[string][]int32{}
	for topic, ps := range revoked {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if st := a.parts[tp]; st != nil && st.stopped != nil {
				// Paused partitions stay paused across rebalances:
				// when it comes back it starts again at its stored
				// offset (and stops again if nothing changed).
				resume[topic] = append(resume[topic], p)
			}
			delete(a.parts, tp)
		}
	}
	if len(resume) > 0 {
		cl.ResumeFetchPartitions(resume)
	}
	a.log.Info("partitions revoked", "partitions", fmt.Sprint(sortedParts(revoked)))
}

// adjustOffsets starts every newly assigned partition at the offset stored
// in the target (at its start when there is none).
func (a *Applier) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for topic, ps := range offsets {
		parts := make([]int32, 0, len(ps))
		for p := range ps {
			parts = append(parts, p)
		}
		starts, err := a.restore(ctx, topic, parts)
		if err != nil {
			return nil, err
		}
		if err := a.checkContinuity(ctx, topic, parts); err != nil {
			return nil, err
		}
		for p, at := range starts {
			st := a.parts[topicPartition{topic, p}]
			if at < 0 {
				ps[p] = kgo.NewOffset().AtStart().WithEpoch(-1)
			} else {
				ps[p] = kgo.NewOffset().At(at).WithEpoch(st.epoch)
			}
		}
	}
	return offsets, nil
}

// checkContinuity stops each newly assigned partition of topic whose
// stored offset does not continue the partition's log: the topic was
// created again since (another topic id), the log starts after it
// (retention or deleted records removed records the group never applied;
// also for a partition with no stored offset whose log no longer starts at
// 0), or it is past the log's end (a truncated log). Applying from there
// would skip records in silence. It records the topic's id with the
// partitions' states. Callers hold a.mu.
func (a *Applier) checkContinuity(ctx context.Context, topic string, parts []int32) error {
	td, err := a.adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("describe topic %s: %w", topic, err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		return fmt.Errorf("describe topic %s: %w", topic, errors.Join(d.Err, kerr.UnknownTopicOrPartition))
	}
	id := hex.EncodeToString(d.ID[:])
	a.counts[topic] = len(d.Partitions)
	starts, err := a.adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets of %s: %w", topic, err)
	}
	ends, err := a.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	for _, p := range parts {
		tp := topicPartition{topic, p}
		st := a.parts[tp]
		if st.stopped != nil {
			continue
		}
		storedID := st.topicID
		st.topicID = id
		next := max(st.prev, 0)
		start, _ := starts.Lookup(topic, p)
		end, _ := ends.Lookup(topic, p)
		var why error
		switch {
		case storedID != "" && storedID != id:
			why = fmt.Errorf("%s partition %d: the topic was re-created (topic id %s; the stored offset %d is of topic id %s, log start now %d): the new log's records are not the ones the offset counts; resync the table, and move the partition's offset (tidemark.stream_offsets) to the new log's start",
				topic, p, id, next, storedID, start.Offset)
		case next < start.Offset:
			why = fmt.Errorf("%s partition %d: stored offset %d is below the log start %d: records %d–%d were removed (retention, deleted records) before this group applied them; resync the table, and move the partition's offset (tidemark.stream_offsets) to the log start",
				topic, p, next, start.Offset, next, start.Offset-1)
		case next > end.Offset:
			why = fmt.Errorf("%s partition %d: stored offset %d is past the log end %d: the log was truncated or the topic re-created; resync the table, and move the partition's offset (tidemark.stream_offsets) to the log start %d",
				topic, p, next, end.Offset, start.Offset)
		}
		if why != nil {
			a.stopPartition(tp, st, next, why)
		}
	}
	return nil
}

// restore reads the stored offsets (and announced schemas) of partitions
// of topic into the member's state and returns where each starts (-1: at
// the partition's start). Callers hold a.mu.
func (a *Applier) restore(ctx context.Context, topic string, parts []int32) (map[int32]int64, error) {
	stored, err := a.target.Offsets(ctx, a.cfg.Group, topic)
	if err != nil {
		return nil, fmt.Errorf("read offsets of %s: %w", topic, err)
	}
	byPart := map[int32]tidemark.StreamOffset{}
	for _, o := range stored {
		byPart[o.Partition] = o
	}
	starts := make(map[int32]int64, len(parts))
	for _, p := range parts {
		st := &partState{prev: -1, hw: -1, epoch: -1}
		if old := a.parts[topicPartition{topic, p}]; old != nil {
			st.stopped = old.stopped // paused until revoked
			st.quarantined = old.quarantined
		}
		starts[p] = -1
		if o, ok := byPart[p]; ok {
			st.prev, st.next, starts[p] = o.Next, o.Next, o.Next
			st.topicID, st.epoch, st.floor = o.TopicID, o.Epoch, o.Floor
			if o.Schema != "" {
				as, err := a.schema([]byte(o.Schema))
				if err != nil {
					return nil, fmt.Errorf("stored schema of %s partition %d: %w", topic, p, err)
				}
				st.schema, st.json = as, o.Schema
				if reason, ok := a.quarantinedTable(ctx, as); ok && st.quarantined == "" {
					st.quarantined = reason
				}
			}
		}
		a.parts[topicPartition{topic, p}] = st
	}
	return starts, nil
}

// quarantinedTable reports whether the table of as is quarantined in the
// target's table states (another member, or an earlier run of this one,
// quarantined it), and why. Callers hold a.mu.
func (a *Applier) quarantinedTable(ctx context.Context, as *announcedSchema) (string, bool) {
	reg, ok := a.target.(tidemark.TableRegistry)
	if !ok {
		return "", false
	}
	states, err := reg.TableStates(ctx, a.source(as))
	if err != nil {
		return "", false // the first row of the table quarantines it again if need be
	}
	for _, ts := range states {
		if ts.Table == as.table.ID && ts.Mode == tidemark.TableQuarantined {
			return ts.Reason, true
		}
	}
	return "", false
}

func (a *Applier) source(as *announcedSchema) string {
	if a.cfg.Source != "" {
		return a.cfg.Source
	}
	return as.source
}

// quarantine records table id of the partitions' topic as quarantined,
// for `tidemark status` and the other members, and marks every assigned
// partition of its topic: their rows of it are skipped until a resync's
// snapshot. It returns an error only when the state cannot be recorded.
// Callers hold a.mu.
func (a *Applier) quarantine(ctx context.Context, topic string, as *announcedSchema, cause error) error {
	reason := fmt.Sprintf("quarantined by apply group %s (topic %s): %v", a.cfg.Group, topic, cause)
	if reg, ok := a.target.(tidemark.TableRegistry); ok {
		if err := reg.SetTableState(ctx, a.source(as), tidemark.TableState{Table: as.table.ID, Mode: tidemark.TableQuarantined, Reason: reason}); err != nil {
			return fmt.Errorf("quarantine %s: %w", as.table.ID, err)
		}
	}
	for tp, st := range a.parts {
		if tp.topic == topic && st.quarantined == "" {
			st.quarantined = reason
		}
	}
	a.log.Error("table quarantined: its rows are skipped from now on (the offsets advance); the other tables continue. Resync it with `tidemark resync --table "+as.table.ID.String()+"` once the cause is fixed",
		"table", as.table.ID.String(), "topic", topic, "err", cause)
	return nil
}

// schema parses a control record's value, sharing one *Table per schema.
// Callers hold a.mu.
func (a *Applier) schema(value []byte) (*announcedSchema, error) {
	if as, ok := a.schemas[string(value)]; ok {
		return as, nil
	}
	as, err := parseSchema(value)
	if err != nil {
		return nil, err
	}
	a.schemas[string(value)] = as
	return as, nil
}

// Run consumes and applies until ctx is done (then it leaves the group and
// returns nil) or an error that retrying cannot fix.
func (a *Applier) Run(ctx context.Context) error {
	defer a.cl.Close() // leaves the group
	// A refused login or certificate stops the member at once: the
	// consumer group's own loop would retry it forever.
	if err := checkAuth(ctx, a.cl, a.cfg.Security, a.cfg.Brokers); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	for {
		// Bounded, so that an idle member still prunes tombstones.
		pctx, cancel := context.WithTimeout(ctx, pruneEvery)
		fs := a.cl.PollRecords(pctx, a.cfg.MaxRecords)
		cancel()
		if ctx.Err() != nil {
			a.cl.AllowRebalance()
			return nil
		}
		if fs.IsClientClosed() {
			return errors.New("apply: the Kafka client was closed")
		}
		var ferr error
		var gaps []topicPartition
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) && pctx.Err() != nil {
				return // the bounded poll ended
			}
			var loss *kgo.ErrDataLoss
			if errors.Is(err, kerr.OffsetOutOfRange) || errors.As(err, &loss) {
				gaps = append(gaps, topicPartition{topic, p})
				return
			}
			a.log.Warn("fetch failed", "topic", topic, "partition", p, "err", err)
			if ferr == nil && !retryable(err) {
				ferr = fmt.Errorf("fetch %s partition %d: %w", topic, p, err)
			}
		})
		for _, tp := range gaps {
			a.stopGap(ctx, tp)
		}
		if ferr != nil {
			a.cl.AllowRebalance()
			return ferr
		}
		a.mu.Lock()
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if st := a.parts[topicPartition{p.Topic, p.Partition}]; st != nil {
				st.hw = p.HighWatermark
			}
		})
		a.mu.Unlock()
		err := a.apply(ctx, fs.Records())
		if err == nil {
			a.mu.Lock()
			a.pruneTombstones(ctx)
			a.mu.Unlock()
		}
		if errors.Is(err, tidemark.ErrOffsetMoved) {
			a.log.Warn("another member applied a partition of this batch (this member lost it without noticing); re-reading the stored offsets", "err", err)
			err = a.reload(ctx)
		}
		a.cl.AllowRebalance()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// reload restarts every assigned partition at its stored offset, dropping
// what was fetched beyond it.
func (a *Applier) reload(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	byTopic := map[string][]int32{}
	for tp := range a.parts {
		byTopic[tp.topic] = append(byTopic[tp.topic], tp.partition)
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	for topic, ps := range byTopic {
		starts, err := a.restore(ctx, topic, ps)
		if err != nil {
			return err
		}
		set[topic] = map[int32]kgo.EpochOffset{}
		for p, at := range starts {
			set[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: max(at, 0)}
		}
	}
	a.cl.SetOffsets(set)
	return nil
}

// apply applies the polled records in one target transaction with the
// partitions' new offsets; a schema control record first applies what came
// before it, then creates or alters the target table.
func (a *Applier) apply(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	// Snapshot rows take their version even when unchanged (Refresh): the
	// end of a snapshot removes the rows older than it.
	b := &tidemark.Batch{Refresh: true}
	touched := map[topicPartition]*partState{}
	flush := func() error {
		if len(touched) == 0 {
			return nil
		}
		for tp, st := range touched {
			b.Offsets = append(b.Offsets, tidemark.StreamOffset{Group: a.cfg.Group, Topic: tp.topic, Partition: tp.partition,
				Next: st.next, Schema: st.json, Prev: st.prev, TopicID: st.topicID, Epoch: st.epoch, Floor: st.floor})
		}
		if b.Source == "" {
			b.Source = "apply:" + a.cfg.Group
		}
		stats, err := a.target.Apply(ctx, b)
		for tries := 0; err != nil && tries < 8; tries++ {
			// A table the target cannot apply is quarantined, and the
			// batch applied again without it.
			te, ok := errors.AsType[*tidemark.TableError](err)
			if !ok {
				break
			}
			var topic string
			var as *announcedSchema
			for tp, st := range touched {
				if st.schema != nil && st.schema.table.ID == te.Table {
					topic, as = tp.topic, st.schema
				}
			}
			if as == nil {
				break
			}
			if qerr := a.quarantine(ctx, topic, as, te); qerr != nil {
				return qerr
			}
			b.Changes = slices.DeleteFunc(b.Changes, func(c tidemark.Change) bool { return c.Table.ID == te.Table })
			stats, err = a.target.Apply(ctx, b)
		}
		if err != nil {
			return fmt.Errorf("apply %d changes of group %s: %w", len(b.Changes), a.cfg.Group, err)
		}
		for _, st := range touched {
			st.prev = st.next
		}
		if stats.Skipped > 0 {
			// Every record is applied once (offsets commit with the
			// rows), so the guard only skips a change that an older
			// publication already carried past: a re-published batch
			// or a snapshot's rows. Worth a line.
			a.log.Info("changes skipped by the version guard (the target already had newer versions)", "skipped", stats.Skipped, "changes", len(b.Changes))
		}
		if a.cfg.OnApply != nil {
			a.cfg.OnApply(ApplyReport{Batch: b, Stats: stats, Records: len(b.Changes), Took: time.Since(start)})
		}
		b = &tidemark.Batch{Refresh: true}
		clear(touched)
		return nil
	}
	for _, r := range recs {
		tp := topicPartition{r.Topic, r.Partition}
		st := a.parts[tp]
		if st == nil {
			return fmt.Errorf("apply %s partition %d offset %d: the partition is not assigned to this member", r.Topic, r.Partition, r.Offset)
		}
		if st.stopped != nil {
			continue // fetched before the partition was paused
		}
		st.epoch = r.LeaderEpoch // stored with next: resuming checks the log still has it
		where := recordPlace{r}  // formatted only in an error
		if ctl, ok := recordHeader(r, controlHeader); ok {
			if kind := string(ctl); kind != string(controlSchema) {
				var err error
				if st.quarantined != "" {
					err = a.resumeQuarantined(ctx, kind, r, st, flush)
				} else {
					err = a.tableControl(ctx, kind, r, st, flush)
					if te, ok := errors.AsType[*tidemark.TableError](err); ok && st.schema != nil && te.Table == st.schema.table.ID {
						err = a.quarantine(ctx, r.Topic, st.schema, te)
					}
				}
				var refused *refusedRecord
				if errors.As(err, &refused) {
					if err := a.stop(tp, st, r.Offset, fmt.Errorf("apply %s: %w", where, err), flush); err != nil {
						return err
					}
					continue
				}
				if err != nil {
					return fmt.Errorf("apply %s: %w", where, err)
				}
				st.next = r.Offset + 1
				touched[tp] = st
				continue
			}
			as, err := a.schema(r.Value)
			if err != nil {
				return fmt.Errorf("apply %s: %w", where, err)
			}
			if err := a.checkScope(r, st, string(controlSchema), as.source, as.table.ID); err != nil {
				if err := a.stop(tp, st, r.Offset, fmt.Errorf("apply %s: %w", where, err), flush); err != nil {
					return err
				}
				continue
			}
			if st.schema != as {
				// Rows before the schema change first, then the
				// new layout, then rows written with it.
				if err := flush(); err != nil {
					return err
				}
				if st.quarantined == "" {
					err := a.target.EnsureTable(ctx, as.table)
					if te, ok := errors.AsType[*tidemark.TableError](err); ok && te.Table == as.table.ID {
						err = a.quarantine(ctx, r.Topic, as, te)
					}
					if err != nil {
						return fmt.Errorf("apply %s: create or alter the target table of %s: %w", where, as.table.ID, err)
					}
				}
				st.schema, st.json = as, string(r.Value)
			}
			if b.Source == "" {
				b.Source = as.source
			}
			st.next = r.Offset + 1
			touched[tp] = st
			continue
		}
		st.next = r.Offset + 1
		touched[tp] = st
		st.records++
		if r.Value == nil || st.quarantined != "" {
			continue // a tombstone (the delete before it did the work), or a row of a quarantined table
		}
		if v, _ := recordHeader(r, "schema_version"); string(v) != EnvelopeVersion {
			return fmt.Errorf("apply %s: envelope version %q, this tidemark reads %q", where, v, EnvelopeVersion)
		}
		shape, _ := recordHeader(r, "table_schema")
		if st.schema == nil || string(shape) != st.schema.fingerprint {
			have := "none"
			if st.schema != nil {
				have = st.schema.fingerprint + " (" + st.schema.table.ID.String() + ")"
			}
			return fmt.Errorf("apply %s: the row was written with table schema %s, but the schema last announced on the partition is %s: refusing to write rows for a layout this applier has not applied (publish with target.kafka.control_records: true, and start appliers on topics written with it)", where, shape, have)
		}
		ch, err := decodeChange(r.Value, st.schema.table)
		if ve, ok := errors.AsType[*tidemark.ValueError](err); ok {
			// A record the target cannot take: its table is
			// quarantined, the others go on.
			if err := a.quarantine(ctx, r.Topic, st.schema, fmt.Errorf("%s: %w", where, ve)); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("apply %s: %w", where, err)
		}
		if b.Source == "" {
			b.Source = st.schema.source
		}
		b.Changes = append(b.Changes, ch)
		if ch.Op != tidemark.OpRead && st.floor.Compare(ch.Version) < 0 {
			st.floor = ch.Version // a snapshot's rows precede older stream rows: not a floor
		}
	}
	return flush()
}

// pruneEvery is how often an applier prunes the tombstones of its topics'
// tables.
const pruneEvery = 10 * time.Second

// pruneTombstones removes, every pruneEvery, the hard-delete tombstones of
// each table whose topic has a partition assigned to this member that are
// older than every partition's stored floor: no change still to be applied
// on any partition of the topic is older than that (StreamOffset.Floor), so
// they guard nothing. A partition without a stored floor keeps them all. An
// error is logged and retried next time. Callers hold a.mu.
func (a *Applier) pruneTombstones(ctx context.Context) {
	pruner, ok := a.target.(tidemark.TombstonePruner)
	if !ok || time.Since(a.prunedAt) < pruneEvery {
		return
	}
	a.prunedAt = time.Now()
	tables := map[string]tidemark.TableID{}
	for tp, st := range a.parts {
		if st.schema != nil {
			tables[tp.topic] = st.schema.table.ID
		}
	}
	for topic, id := range tables {
		stored, err := a.target.Offsets(ctx, a.cfg.Group, topic)
		if err != nil || a.counts[topic] == 0 || len(stored) < a.counts[topic] {
			continue
		}
		floor := stored[0].Floor
		for _, o := range stored[1:] {
			if o.Floor.Compare(floor) < 0 {
				floor = o.Floor
			}
		}
		if floor == (tidemark.Version{}) {
			continue
		}
		n, err := pruner.PruneTombstones(ctx, id, floor)
		if err != nil {
			a.log.Warn("prune tombstones failed (retried later)", "table", id.String(), "err", err)
			continue
		}
		if n > 0 {
			a.log.Debug("pruned tombstones older than every partition's floor", "table", id.String(), "floor", floor.String(), "removed", n)
		}
	}
}

// resumeQuarantined handles a control record of partition st while its
// table is quarantined: only a snapshot_begin of the table (a resync)
// matters: the target table is brought to the partition's schema and the
// partition applies the table again from there; the snapshot's rows and its
// end replace what was skipped. Callers hold a.mu.
func (a *Applier) resumeQuarantined(ctx context.Context, kind string, r *kgo.Record, st *partState, flush func() error) error {
	if kind != string(controlSnapshotBegin) || st.schema == nil {
		return nil
	}
	tc, err := parseTableControl(kind, r.Value)
	if err != nil {
		return err
	}
	if err := a.checkScope(r, st, kind, tc.Source, tidemark.TableID{Database: tc.Database, Name: tc.Table}); err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	err = a.target.EnsureTable(ctx, st.schema.table)
	if te, ok := errors.AsType[*tidemark.TableError](err); ok {
		return a.quarantine(ctx, r.Topic, st.schema, te) // still not applicable
	}
	if err != nil {
		return fmt.Errorf("create or alter the target table of %s: %w", st.schema.table.ID, err)
	}
	st.quarantined = ""
	a.log.Info("a snapshot of a quarantined table begins on the partition: applying it again", "table", st.schema.table.ID.String(), "topic", r.Topic, "partition", r.Partition)
	return nil
}

// tableControl applies a control record of a table (all kinds but schema)
// of partition st: flush applies the batch so far first, so the rows before
// it are in the target. Callers hold a.mu.
func (a *Applier) tableControl(ctx context.Context, kind string, r *kgo.Record, st *partState, flush func() error) error {
	switch kind {
	case string(controlTruncate), string(controlDrop), string(controlSnapshotBegin), string(controlSnapshotEnd):
	default:
		return fmt.Errorf("unknown control record %q (a newer tidemark wrote it?)", kind)
	}
	tc, err := parseTableControl(kind, r.Value)
	if err != nil {
		return err
	}
	id := tidemark.TableID{Database: tc.Database, Name: tc.Table}
	if err := a.checkScope(r, st, kind, tc.Source, id); err != nil {
		return err
	}
	v := tidemark.Version{Seq: tc.Seq, Index: tc.Index}
	if kind == string(controlSnapshotBegin) {
		a.log.Info("snapshot of a table begins on the partition", "table", id.String(), "topic", r.Topic, "partition", r.Partition, "reason", tc.Reason)
		return nil
	}
	// Rows before it first.
	if err := flush(); err != nil {
		return err
	}
	switch kind {
	case string(controlTruncate):
		if err := a.target.TruncateBefore(ctx, id, v, time.Time{}); err != nil {
			return fmt.Errorf("TRUNCATE of %s: %w", id, err)
		}
	case string(controlSnapshotEnd):
		n, err := a.target.RemoveBefore(ctx, id, v)
		if err != nil {
			return fmt.Errorf("end of the snapshot of %s: %w", id, err)
		}
		a.log.Info("snapshot of a table ends on the partition; target rows it did not carry removed", "table", id.String(),
			"topic", r.Topic, "partition", r.Partition, "version", v.String(), "removed", n)
	case string(controlDrop):
		if err := a.target.DropBefore(ctx, id, v); err != nil {
			return fmt.Errorf("DROP TABLE of %s: %w", id, err)
		}
		if st.schema != nil && st.schema.table.ID == id {
			// The layout is gone: the table's next row on this
			// partition needs a schema record again.
			st.schema, st.json = nil, ""
		}
	}
	return nil
}

// refusedRecord is a record the applier must not act on (checkScope): its
// partition stops, the others go on.
type refusedRecord struct{ msg string }

func (e *refusedRecord) Error() string { return e.msg }

func refuse(format string, args ...any) error {
	return &refusedRecord{msg: fmt.Sprintf(format, args...)}
}

// checkScope refuses a control record (of kind, naming source and table
// id) that does not belong to the topic it was read from: its envelope
// version must be this tidemark's, its source the group's, the topic of
// its table the record's topic, and its table the one announced on the
// partition. A record that names another table (produced by anyone who can
// write to the brokers) would otherwise truncate, drop or resnapshot that
// table. Callers hold a.mu.
func (a *Applier) checkScope(r *kgo.Record, st *partState, kind, source string, id tidemark.TableID) error {
	if v, _ := recordHeader(r, "schema_version"); string(v) != EnvelopeVersion {
		return refuse("refusing a %s control record: envelope version %q, this tidemark reads %q", kind, v, EnvelopeVersion)
	}
	if a.cfg.Source != "" && source != a.cfg.Source {
		return refuse("refusing a %s control record of source %q: the group applies source %q", kind, source, a.cfg.Source)
	}
	want, err := a.topics.topicName(source, id)
	if err != nil || want != r.Topic {
		if err != nil {
			want = err.Error()
		}
		return refuse("refusing a %s control record of table %s: a control record acts only on its topic's table, and the topic of %s is %s (topic_template %q), not %s",
			kind, id, id, want, a.topics.TopicTemplate, r.Topic)
	}
	if st.schema != nil && kind != string(controlSchema) && st.schema.table.ID != id {
		return refuse("refusing a %s control record of table %s: the partition carries table %s", kind, id, st.schema.table.ID)
	}
	return nil
}

// stop stops partition tp at its record at offset (nothing of it or after
// it is applied; the stored offset stays before it): the batch so far is
// applied first, the partition is paused and err is logged once. The
// member goes on with its other partitions. Callers hold a.mu.
func (a *Applier) stop(tp topicPartition, st *partState, offset int64, err error, flush func() error) error {
	if ferr := flush(); ferr != nil {
		return ferr
	}
	a.stopPartition(tp, st, offset, err)
	return nil
}

// stopGap stops a partition whose fetch was out of range (the log no
// longer holds the records at the fetch offset) or found the log
// truncated, naming the stored offset and the log's start.
func (a *Applier) stopGap(ctx context.Context, tp topicPartition) {
	start := int64(-1)
	if so, err := a.adm.ListStartOffsets(ctx, tp.topic); err == nil {
		if o, ok := so.Lookup(tp.topic, tp.partition); ok && o.Err == nil {
			start = o.Offset
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.parts[tp]
	if st == nil || st.stopped != nil {
		return
	}
	next := max(st.prev, 0)
	a.stopPartition(tp, st, next, fmt.Errorf("%s partition %d: stored offset %d is no longer in the log (log start %d; retention, deleted records or a truncated log removed records this group has not applied): resync the table, and move the partition's offset (tidemark.stream_offsets) to the log start",
		tp.topic, tp.partition, next, start))
}

// stopPartition stops partition tp at offset with err (stop). Callers
// hold a.mu.
func (a *Applier) stopPartition(tp topicPartition, st *partState, offset int64, err error) {
	st.stopped = err
	a.cl.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	a.log.Error("partition stopped: nothing of it is applied from this offset on; the member goes on with its other partitions",
		"topic", tp.topic, "partition", tp.partition, "offset", offset, "err", err)
}

func recordHeader(r *kgo.Record, key string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

// Status returns the partitions assigned to this member, sorted.
func (a *Applier) Status() []PartitionStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]PartitionStatus, 0, len(a.parts))
	for tp, st := range a.parts {
		ps := PartitionStatus{Topic: tp.topic, Partition: tp.partition, Next: st.prev, HighWatermark: st.hw, Records: st.records}
		if ps.Next < 0 {
			ps.Next = 0
		}
		if st.schema != nil {
			ps.Table = st.schema.table.ID.String()
		}
		if st.stopped != nil {
			ps.Stopped = st.stopped.Error()
		}
		out = append(out, ps)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

func sortedParts(m map[string][]int32) []string {
	var out []string
	for t, ps := range m {
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		out = append(out, fmt.Sprintf("%s%v", t, ps))
	}
	sort.Strings(out)
	return out
}

// GroupPartition is one partition of an apply group's topics, as the
// brokers see it.
type GroupPartition struct {
	Topic     string
	Partition int32
	// End is the partition's end offset (one past its last record or
	// transaction marker).
	End int64
	// Member is the group member the partition is assigned to (member id
	// and host), "" when none.
	Member string
}

// GroupStatus lists the partitions of the topics an apply group with cfg
// consumes (Topics minus Exclude), with their end offsets and the member
// each is assigned to. It does not join the group.
func GroupStatus(ctx context.Context, cfg ApplierConfig) ([]GroupPartition, error) {
	inc, err := regexp.Compile(cfg.Topics)
	if err != nil {
		return nil, cfgErr("topics", "%v", err)
	}
	exc, err := regexp.Compile(cfg.Exclude)
	if err != nil {
		return nil, cfgErr("exclude", "%v", err)
	}
	sec := cfg.Security.withDefaults()
	secOpts, err := sec.opts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID("tidemark-status")}, secOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("read apply group %s: %w", cfg.Group, err)
	}
	defer cl.Close()
	if err := checkAuth(ctx, cl, sec, cfg.Brokers); err != nil {
		return nil, fmt.Errorf("read apply group %s: %w", cfg.Group, err)
	}
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("read apply group %s: list topics: %w", cfg.Group, err)
	}
	var topics []string
	for _, t := range td.Names() {
		if inc.MatchString(t) && (cfg.Exclude == "" || !exc.MatchString(t)) {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		return nil, nil
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("read apply group %s: end offsets: %w", cfg.Group, err)
	}
	owner := map[topicPartition]string{}
	groups, err := adm.DescribeGroups(ctx, cfg.Group)
	if err != nil {
		return nil, fmt.Errorf("read apply group %s: %w", cfg.Group, err)
	}
	for _, g := range groups {
		for _, m := range g.Members {
			a, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			for _, t := range a.Topics {
				for _, p := range t.Partitions {
					owner[topicPartition{t.Topic, p}] = m.MemberID + "@" + strings.TrimPrefix(m.ClientHost, "/")
				}
			}
		}
	}
	var out []GroupPartition
	ends.Each(func(o kadm.ListedOffset) {
		out = append(out, GroupPartition{Topic: o.Topic, Partition: o.Partition, End: o.Offset, Member: owner[topicPartition{o.Topic, o.Partition}]})
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out, nil
}

// recordPlace names a record in an error: "topic partition P offset O".
type recordPlace struct{ r *kgo.Record }

func (p recordPlace) String() string {
	return fmt.Sprintf("%s partition %d offset %d", p.r.Topic, p.r.Partition, p.r.Offset)
}
