// Package metrics holds tidemark's Prometheus metrics (in their own
// registry) and serves them with /healthz, /readyz and the status page.
// The daemon feeds it from the pipeline's callbacks; collectors that read
// a component's state at scrape time (dedupe, direct inserts, an applier's
// partitions) take functions, so that it imports only the root package.
package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"tidemark"
)

// ErrNoCheckpointYet is returned (wrapped) by a retention probe when there
// is no position to measure the retention of yet (a first start, before
// the first commit). WatchRetention does not count it as an error.
var ErrNoCheckpointYet = errors.New("no checkpoint yet")

// Metrics holds tidemark's Prometheus metrics (in their own registry) and
// serves them with /healthz and /readyz. Feed it with OnApply (as the
// pipeline's OnApply callback), Error, FallbackRun, SetRetention (or
// WatchRetention), WatchDedupe and SetReady. It is safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	changes      *prometheus.CounterVec
	applied      *prometheus.CounterVec
	batchChanges prometheus.Histogram
	batchBytes   prometheus.Histogram
	applySeconds prometheus.Histogram
	lag          *prometheus.GaugeVec
	lastCommit   *prometheus.GaugeVec
	fallbackRuns prometheus.Counter
	fallbackRows *prometheus.CounterVec
	headroom     prometheus.Gauge
	errors       *prometheus.CounterVec
	verifyTables *prometheus.GaugeVec
	verifyAt     prometheus.Gauge

	ready atomic.Bool

	mu     sync.Mutex
	dedupe func(func(name string, v uint64))
	page   http.Handler // the status page at /, nil: none
}

// New registers tidemark's metrics (and the Go and process collectors) in
// a new registry.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidemark_changes_total",
		Help: "Row changes committed to the target, by source table and op (c, u, d, r)."}, []string{"table", "op"})
	m.applied = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidemark_apply_rows_total",
		Help: "What the sink did with each change: inserted, updated, deleted, skipped (version guard), coalesced."}, []string{"result"})
	m.batchChanges = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidemark_batch_changes",
		Help: "Changes per committed batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 9)})
	m.batchBytes = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidemark_batch_bytes",
		Help: "Estimated bytes per committed batch.", Buckets: prometheus.ExponentialBuckets(256, 4, 10)})
	m.applySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidemark_apply_seconds",
		Help: "Time to apply and commit one batch.", Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)})
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidemark_lag_seconds",
		Help: "Source commit → target commit of the newest change of the table in the last batch (daemon clock minus source commit time; 1 s resolution)."}, []string{"table"})
	m.lastCommit = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidemark_last_source_commit_timestamp_seconds",
		Help: "Source commit time of the newest change applied, per table (time() minus this is the staleness while the source is idle or stuck)."}, []string{"table"})
	m.fallbackRuns = prometheus.NewCounter(prometheus.CounterOpts{Name: "tidemark_fallback_runs_total",
		Help: "Catch-up (fallback) runs."})
	m.fallbackRows = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidemark_fallback_rows_total",
		Help: "Rows read by catch-up runs, per table."}, []string{"table"})
	m.headroom = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidemark_binlog_retention_headroom_seconds",
		Help: "Time left before the source may purge the binlog file holding the checkpoint (+Inf: never purged by age; negative: purgeable at the next rotation)."})
	m.headroom.Set(math.NaN())
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidemark_errors_total",
		Help: "Errors by class."}, []string{"class"})
	m.verifyTables = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidemark_verify_tables",
		Help: "Tables of the last `tidemark verify` of the source, by verdict (equal, different, error); absent until a run is recorded. Alert on verdict=\"different\" > 0."}, []string{"verdict"})
	m.verifyAt = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidemark_verify_last_run_timestamp_seconds",
		Help: "When the last `tidemark verify` of the source finished (target clock); NaN until a run is recorded."})
	m.verifyAt.Set(math.NaN())
	m.reg.MustRegister(m.changes, m.applied, m.batchChanges, m.batchBytes, m.applySeconds, m.lag, m.lastCommit,
		m.fallbackRuns, m.fallbackRows, m.headroom, m.errors, m.verifyTables, m.verifyAt, &dedupeCollector{m: m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"inserted", "updated", "deleted", "skipped", "coalesced"} {
		m.applied.WithLabelValues(r)
	}
	return m
}

// Registry returns the registry, to add collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// OnApply records a committed batch; its signature is
// tidemark.PipelineConfig.OnApply's.
func (m *Metrics) OnApply(b *tidemark.Batch, s tidemark.ApplyStats, took time.Duration) {
	m.applySeconds.Observe(took.Seconds())
	m.batchChanges.Observe(float64(len(b.Changes)))
	m.batchBytes.Observe(float64(b.Bytes()))
	m.applied.WithLabelValues("inserted").Add(float64(s.Inserted))
	m.applied.WithLabelValues("updated").Add(float64(s.Updated))
	m.applied.WithLabelValues("deleted").Add(float64(s.Deleted))
	m.applied.WithLabelValues("skipped").Add(float64(s.Skipped))
	m.applied.WithLabelValues("coalesced").Add(float64(s.Coalesced))
	type key struct {
		table string
		op    tidemark.Op
	}
	counts := map[key]int{}
	newest := map[string]time.Time{}
	for i := range b.Changes {
		c := &b.Changes[i]
		if c.Table == nil {
			continue
		}
		name := c.Table.ID.String()
		counts[key{name, c.Op}]++
		if c.CommitTime.After(newest[name]) {
			newest[name] = c.CommitTime
		}
	}
	for k, n := range counts {
		m.changes.WithLabelValues(k.table, k.op.String()).Add(float64(n))
	}
	now := time.Now()
	for t, ct := range newest {
		if ct.IsZero() {
			continue
		}
		m.lag.WithLabelValues(t).Set(math.Max(0, now.Sub(ct).Seconds()))
		m.lastCommit.WithLabelValues(t).Set(float64(ct.UnixMilli()) / 1000)
	}
	m.ready.Store(true)
}

// FallbackRun records one catch-up run and the rows it read per table.
func (m *Metrics) FallbackRun(rowsByTable map[string]int64) {
	m.fallbackRuns.Inc()
	for t, n := range rowsByTable {
		m.fallbackRows.WithLabelValues(t).Add(float64(n))
	}
}

// Error counts an error by its class (see errorClass).
func (m *Metrics) Error(err error) {
	if err == nil {
		return
	}
	m.errors.WithLabelValues(errorClass(err)).Inc()
}

// errorClass maps an error to a small, fixed set of label values.
func errorClass(err error) string {
	var ve *tidemark.ValueError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	case errors.Is(err, tidemark.ErrPositionPurged):
		return "position_purged"
	case errors.Is(err, tidemark.ErrPositionAhead):
		return "position_ahead"
	case errors.Is(err, tidemark.ErrSourceConfig):
		return "source_config"
	case errors.Is(err, tidemark.ErrDuplicateKeys):
		return "duplicate_keys"
	case errors.Is(err, tidemark.ErrStatsMismatch):
		return "stats_mismatch"
	case errors.Is(err, tidemark.ErrZeroDate), errors.Is(err, tidemark.ErrAmbiguousTime), errors.Is(err, tidemark.ErrNonexistentTime), errors.As(err, &ve):
		return "value"
	case errors.Is(err, tidemark.ErrInvalidIdentifier):
		return "invalid_identifier"
	case tidemark.IsRetryable(err):
		return "transient"
	}
	return "other"
}

// SetRetention records the binlog retention headroom.
func (m *Metrics) SetRetention(r tidemark.Retention) {
	switch {
	case r.Purged:
		m.headroom.Set(math.Inf(-1))
	case r.Unbounded:
		m.headroom.Set(math.Inf(1))
	default:
		m.headroom.Set(r.Headroom.Seconds())
	}
}

// WatchRetention measures the retention headroom every interval until ctx
// is done (it returns nil then). A failed probe is logged and counted, not
// fatal.
func (m *Metrics) WatchRetention(ctx context.Context, interval time.Duration, probe func(context.Context) (tidemark.Retention, error), log *slog.Logger) error {
	if interval <= 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := probe(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrNoCheckpointYet) {
				// A first start: nothing to measure until the first
				// commit.
				log.Debug("binlog retention not measured yet", "err", err)
			} else {
				m.Error(err)
				log.Warn("could not measure binlog retention", "err", err)
			}
		} else {
			m.SetRetention(r)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// WatchDedupe exposes a dedupe window's counters: each must call its
// argument with every counter's name and value (dedupe.Stats.Each). The
// "keys" value is a gauge, the others counters.
func (m *Metrics) WatchDedupe(each func(func(name string, v uint64))) {
	m.mu.Lock()
	m.dedupe = each
	m.mu.Unlock()
}

// EachDedupe calls f with each dedupe counter, once WatchDedupe was called
// (the status page).
func (m *Metrics) EachDedupe(f func(name string, v uint64)) {
	m.mu.Lock()
	each := m.dedupe
	m.mu.Unlock()
	if each != nil {
		each(f)
	}
}

// WatchDirectInserts exposes the PostgreSQL sink's direct insert path:
// rows COPYed straight into their table, and attempts that met an
// existing key and were staged instead (read at scrape time).
func (m *Metrics) WatchDirectInserts(counts func() (rows, conflicts int64)) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tidemark_direct_insert_rows_total",
			Help: "Rows inserted by COPY straight into the target (batches of fresh inserts)."},
			func() float64 { r, _ := counts(); return float64(r) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tidemark_direct_insert_conflicts_total",
			Help: "Direct inserts that met an existing key and were staged and upserted instead."},
			func() float64 { _, c := counts(); return float64(c) }))
}

// Partition is one partition assigned to an apply-group member.
type Partition struct {
	Topic     string
	Partition int32
	// Lag is the records not applied yet (high watermark minus Next; -1
	// before the first fetch); Next the next offset to apply; Records
	// the records this member applied from it.
	Lag, Next, Records int64
}

// WatchPartitions exports the partitions assigned to an apply-group
// member, read at scrape time: tidemark_apply_partition_lag_records,
// _next_offset and _records_total, labelled by topic and partition.
func (m *Metrics) WatchPartitions(status func() []Partition) {
	m.reg.MustRegister(applierCollector{status})
}

var (
	applyLagDesc     = prometheus.NewDesc("tidemark_apply_partition_lag_records", "Records of an assigned partition not applied yet (high watermark minus next offset; -1 before the first fetch).", []string{"topic", "partition"}, nil)
	applyNextDesc    = prometheus.NewDesc("tidemark_apply_partition_next_offset", "Next offset to apply of an assigned partition (committed in the target).", []string{"topic", "partition"}, nil)
	applyRecordsDesc = prometheus.NewDesc("tidemark_apply_partition_records_total", "Records this member applied from an assigned partition.", []string{"topic", "partition"}, nil)
)

// applierCollector reads an applier's assignment at scrape time.
type applierCollector struct {
	status func() []Partition
}

func (applierCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- applyLagDesc
	ch <- applyNextDesc
	ch <- applyRecordsDesc
}

func (c applierCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.status() {
		part := strconv.Itoa(int(p.Partition))
		ch <- prometheus.MustNewConstMetric(applyLagDesc, prometheus.GaugeValue, float64(p.Lag), p.Topic, part)
		ch <- prometheus.MustNewConstMetric(applyNextDesc, prometheus.GaugeValue, float64(p.Next), p.Topic, part)
		ch <- prometheus.MustNewConstMetric(applyRecordsDesc, prometheus.CounterValue, float64(p.Records), p.Topic, part)
	}
}

// SetVerify records the last verify run of the source.
func (m *Metrics) SetVerify(r tidemark.VerifyRun) {
	m.verifyTables.WithLabelValues("equal").Set(float64(r.Tables - r.Differing - r.Errors))
	m.verifyTables.WithLabelValues("different").Set(float64(r.Differing))
	m.verifyTables.WithLabelValues("error").Set(float64(r.Errors))
	m.verifyAt.Set(float64(r.FinishedAt.UnixMilli()) / 1000)
}

// SetStatusPage makes Handler serve page at / (the status page).
func (m *Metrics) SetStatusPage(page http.Handler) {
	m.mu.Lock()
	m.page = page
	m.mu.Unlock()
}

// SetReady sets what /readyz answers (OnApply sets it).
func (m *Metrics) SetReady(ok bool) { m.ready.Store(ok) }

var (
	dedupeChangesDesc = prometheus.NewDesc("tidemark_dedupe_total", "Dedupe window counters by name (seen, passed, dropped_duplicate, dropped_regression, ...).", []string{"name"}, nil)
	dedupeKeysDesc    = prometheus.NewDesc("tidemark_dedupe_keys", "Keys held in the dedupe window's state.", nil, nil)
)

// dedupeCollector reads the dedupe counters at scrape time.
type dedupeCollector struct{ m *Metrics }

func (c *dedupeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- dedupeChangesDesc
	ch <- dedupeKeysDesc
}

func (c *dedupeCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	each := c.m.dedupe
	c.m.mu.Unlock()
	if each == nil {
		return
	}
	each(func(name string, v uint64) {
		if name == "keys" {
			ch <- prometheus.MustNewConstMetric(dedupeKeysDesc, prometheus.GaugeValue, float64(v))
			return
		}
		ch <- prometheus.MustNewConstMetric(dedupeChangesDesc, prometheus.CounterValue, float64(v), name)
	})
}

// Handler serves /metrics, /healthz (200 while the process runs), /readyz
// (200 once a batch has been committed and until SetReady(false)) and, once
// SetStatusPage was called, the status page at /.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		page := m.page
		m.mu.Unlock()
		if page == nil {
			http.NotFound(w, r)
			return
		}
		page.ServeHTTP(w, r)
	})
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "not ready: no batch committed yet", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// Serve listens on listen (host:port) and serves Handler until ctx is
// done; it then shuts the server down and returns nil. A listen error is
// returned at once. With listen "off" it just waits for ctx.
// web (nil: plain HTTP without authentication) adds TLS and basic
// authentication to every path.
func (m *Metrics) Serve(ctx context.Context, listen string, web *WebConfig, log *slog.Logger) error {
	if listen == "off" {
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", listen, err)
	}
	return m.ServeOn(ctx, ln, web, log)
}

// ServeOn serves Handler on ln until ctx is done, as Serve does; it warns
// when ln is reachable beyond loopback without authentication (web has no
// basic_auth_users) or in plain text.
func (m *Metrics) ServeOn(ctx context.Context, ln net.Listener, web *WebConfig, log *slog.Logger) error {
	if host, _, err := net.SplitHostPort(ln.Addr().String()); err == nil {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			if web == nil || len(web.Users) == 0 {
				log.Warn("metrics endpoint is reachable beyond loopback and has no authentication (metrics.web_config_file: basic_auth_users)", "addr", ln.Addr().String())
			}
			if web == nil || web.TLS == nil {
				log.Warn("metrics endpoint is reachable beyond loopback in plain text (metrics.web_config_file: tls_server_config)", "addr", ln.Addr().String())
			}
		}
	}
	scheme := "http://"
	if web != nil && web.TLS != nil {
		ln = tls.NewListener(ln, web.TLS)
		scheme = "https://"
	}
	srv := &http.Server{Handler: web.authenticate(m.Handler()), ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving metrics and the status page", "metrics", scheme+ln.Addr().String()+"/metrics", "status", scheme+ln.Addr().String()+"/")
	select {
	case err := <-errc:
		return fmt.Errorf("serve metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-errc
	return nil
}

// WatchTableStates registers tidemark_table_state{table, state} (1 for the
// table's current state, 0 for the others) and returns the pipeline's
// OnTableState callback that keeps it current.
func (m *Metrics) WatchTableStates() func(tidemark.TableState) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidemark_table_state",
		Help: "Replication state of each table: 1 for its current state (streaming, quarantined, resync, snapshotting), 0 for the others. Alert on state=\"quarantined\"."},
		[]string{"table", "state"})
	m.Registry().MustRegister(g)
	modes := []tidemark.TableMode{tidemark.TableStreaming, tidemark.TableQuarantined, tidemark.TableResyncRequested, tidemark.TableSnapshotting}
	return func(st tidemark.TableState) {
		for _, mode := range modes {
			v := 0.0
			if mode == st.Mode {
				v = 1
			}
			g.WithLabelValues(st.Table.String(), string(mode)).Set(v)
		}
	}
}
