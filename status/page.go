package status

import (
	"context"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"tidemark"
)

// The status page: http://127.0.0.1:9650/ (the metrics listener). One HTML
// page, no external assets, no JavaScript; it reloads itself every
// Page.Refresh (a <meta http-equiv="refresh">). It shows:
//
//   - the source (name, flavor, address, tidemark's replica server_id) and
//     the checkpoint stored in the target;
//   - the binlog retention headroom of the checkpoint's file;
//   - the end-to-end lag: per table, source commit → target commit of the
//     newest applied change (the target's _tm_ columns) and, for the last
//     batch, the daemon's clock minus the source commit time;
//   - each table's mode: streaming, snapshot (a snapshot or a requested
//     resync in progress), catch-up (an automatic catch-up is running),
//     quarantined — with the reason;
//   - throughput (changes applied per second over the last minute) and the
//     apply and dedupe counters since the start;
//   - the last `tidemark verify` of the source (stored in the target);
//   - the last warnings and errors the daemon logged.
//
// What comes from the databases (checkpoint, retention, tables, verify) is
// read when the page is requested, at most once per Refresh (a cached copy
// otherwise), under a timeout; a failure to read it is shown on the page.

// Sources is what the page reads: the databases, and the daemon's
// counters.
type Sources struct {
	// Report builds the `tidemark status` report (checkpoint, retention,
	// tables with their recorded modes).
	Report func(ctx context.Context) (*Report, error)
	// LastVerify reads the last verify run.
	LastVerify func(ctx context.Context) (tidemark.VerifyRun, bool, error)
	// Dedupe, if set, calls f with each dedupe counter.
	Dedupe func(f func(name string, v uint64))
	// OnVerify, if set, receives every verify run read (the metrics).
	OnVerify func(tidemark.VerifyRun)
}

// Page serves the status page. Feed it with OnApply, SetCatchUp and
// the logger from Tee; it is safe for concurrent use.
type Page struct {
	// Refresh is the page's reload interval and the most often the
	// databases are read (default 5s).
	Refresh  time.Duration
	identity Identity
	src      Sources
	started  time.Time

	mu         sync.Mutex
	applied    tidemark.ApplyStats
	batches    int64
	samples    []rateSample // (time, changes applied) for the last minute
	lastBatch  time.Time
	lastLag    time.Duration // daemon clock − newest source commit of the last batch
	catchingUp bool
	cached     *pageData
	cachedAt   time.Time
	recent     []logEntry // newest last
}

// Identity is what the page says about the source: its name, flavor and
// address, tidemark's replica server_id and tidemark's version.
type Identity struct {
	Name, Flavor, Addr, Version string
	ServerID                    uint32
}

type rateSample struct {
	at      time.Time
	changes int64
}

// logEntry is one warning or error the daemon logged.
type logEntry struct {
	Time    time.Time
	Level   string
	Message string
	Attrs   string
}

// maxRecent is how many log lines the page keeps.
const maxRecent = 20

// NewPage returns a page over the given source.
func NewPage(id Identity, src Sources) *Page {
	now := time.Now()
	return &Page{Refresh: 5 * time.Second, identity: id, src: src, started: now, samples: []rateSample{{at: now}}}
}

// OnApply records a committed batch (the pipeline's OnApply signature).
func (p *Page) OnApply(b *tidemark.Batch, s tidemark.ApplyStats, _ time.Duration) {
	now := time.Now()
	var newest time.Time
	for i := range b.Changes {
		if ct := b.Changes[i].CommitTime; ct.After(newest) {
			newest = ct
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applied.Add(s)
	p.batches++
	p.lastBatch = now
	if !newest.IsZero() {
		p.lastLag = max(0, now.Sub(newest))
	}
	p.samples = append(p.samples, rateSample{now, int64(p.applied.Total())})
	// Keep the last minute and the newest sample before it (the base).
	cut := 0
	for cut+1 < len(p.samples) && now.Sub(p.samples[cut+1].at) > time.Minute {
		cut++
	}
	p.samples = p.samples[cut:]
}

// SetCatchUp marks an automatic catch-up as running (tables streaming are
// shown in mode catch-up).
func (p *Page) SetCatchUp(running bool) {
	p.mu.Lock()
	p.catchingUp = running
	p.mu.Unlock()
}

// Tee returns a handler that passes every record to h and keeps warnings
// and errors for the page.
func (p *Page) Tee(h slog.Handler) slog.Handler { return &teeHandler{h: h, page: p} }

func (p *Page) keep(e logEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recent = append(p.recent, e)
	if len(p.recent) > maxRecent {
		p.recent = p.recent[len(p.recent)-maxRecent:]
	}
}

// teeHandler is Page.Tee's handler.
type teeHandler struct {
	h     slog.Handler
	page  *Page
	attrs []slog.Attr
	group string
}

func (t *teeHandler) Enabled(ctx context.Context, l slog.Level) bool { return t.h.Enabled(ctx, l) }

func (t *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		add := func(a slog.Attr) {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%v", a.Key, a.Value)
		}
		for _, a := range t.attrs {
			add(a)
		}
		r.Attrs(func(a slog.Attr) bool {
			if t.group != "" {
				a.Key = t.group + "." + a.Key
			}
			add(a)
			return true
		})
		t.page.keep(logEntry{Time: r.Time.UTC(), Level: r.Level.String(), Message: r.Message, Attrs: b.String()})
	}
	return t.h.Handle(ctx, r)
}

func (t *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *t
	n.h = t.h.WithAttrs(as)
	n.attrs = append(append([]slog.Attr{}, t.attrs...), as...)
	if t.group != "" {
		for i := len(t.attrs); i < len(n.attrs); i++ {
			n.attrs[i].Key = t.group + "." + n.attrs[i].Key
		}
	}
	return &n
}

func (t *teeHandler) WithGroup(name string) slog.Handler {
	n := *t
	n.h = t.h.WithGroup(name)
	if t.group != "" {
		name = t.group + "." + name
	}
	n.group = name
	return &n
}

// pageData is what the template renders.
type pageData struct {
	Generated  time.Time
	Refresh    int
	Identity   Identity
	Uptime     string
	Report     *Report
	ReportErr  string
	MaxLag     string
	LastLag    string
	LastBatch  string
	Applied    tidemark.ApplyStats
	Total      int
	Batches    int64
	Rate       string
	Dedupe     []counter
	Verify     *tidemark.VerifyRun
	VerifyErr  string
	Recent     []logEntry
	CatchingUp bool
}

type counter struct {
	Name  string
	Value uint64
}

// data builds the page's content, reading the databases at most once per
// Refresh.
func (p *Page) data(ctx context.Context) *pageData {
	p.mu.Lock()
	cached, at := p.cached, p.cachedAt
	p.mu.Unlock()
	d := &pageData{}
	if cached != nil && time.Since(at) < p.refresh() {
		*d = *cached
	} else {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rep, err := p.src.Report(rctx)
		if err != nil {
			d.ReportErr = err.Error()
		}
		d.Report = rep
		run, ok, err := p.src.LastVerify(rctx)
		cancel()
		switch {
		case err != nil:
			d.VerifyErr = err.Error()
		case ok:
			d.Verify = &run
		}
		if p.src.OnVerify != nil && d.Verify != nil {
			p.src.OnVerify(*d.Verify)
		}
		c := *d
		p.mu.Lock()
		p.cached, p.cachedAt = &c, time.Now()
		p.mu.Unlock()
	}
	now := time.Now()
	d.Generated = now.UTC()
	d.Refresh = int(p.refresh().Seconds())
	d.Identity = p.identity
	d.Uptime = now.Sub(p.started).Round(time.Second).String()
	p.mu.Lock()
	d.Applied, d.Batches, d.CatchingUp = p.applied, p.batches, p.catchingUp
	d.Recent = append([]logEntry(nil), p.recent...)
	if !p.lastBatch.IsZero() {
		d.LastBatch = now.Sub(p.lastBatch).Round(time.Millisecond).String() + " ago"
		d.LastLag = p.lastLag.Round(time.Millisecond).String()
	}
	// Changes per second over the last minute (since the start when
	// younger): from the newest sample at least a minute old.
	if n := len(p.samples); n > 0 {
		base, last := p.samples[0], p.samples[n-1]
		for _, sm := range p.samples {
			if now.Sub(sm.at) >= time.Minute {
				base = sm
			}
		}
		if secs := now.Sub(base.at).Seconds(); secs > 0 {
			d.Rate = fmt.Sprintf("%.0f", float64(last.changes-base.changes)/secs)
		}
	}
	p.mu.Unlock()
	d.Total = d.Applied.Total()
	if d.Rate == "" {
		d.Rate = "0"
	}
	// Newest first.
	for i, j := 0, len(d.Recent)-1; i < j; i, j = i+1, j-1 {
		d.Recent[i], d.Recent[j] = d.Recent[j], d.Recent[i]
	}
	if d.Report != nil {
		tables := make([]Table, len(d.Report.Tables))
		copy(tables, d.Report.Tables)
		maxLag := math.NaN()
		for i := range tables {
			tables[i].Mode = pageMode(tables[i].Mode, d.CatchingUp)
			if l := tables[i].LagSeconds; l != nil && (math.IsNaN(maxLag) || *l > maxLag) {
				maxLag = *l
			}
		}
		rep := *d.Report
		rep.Tables = tables
		d.Report = &rep
		if !math.IsNaN(maxLag) {
			d.MaxLag = (time.Duration(maxLag * float64(time.Second))).Round(time.Millisecond).String()
		}
	}
	if p.src.Dedupe != nil {
		p.src.Dedupe(func(name string, v uint64) { d.Dedupe = append(d.Dedupe, counter{name, v}) })
		sort.Slice(d.Dedupe, func(i, j int) bool { return d.Dedupe[i].Name < d.Dedupe[j].Name })
	}
	return d
}

// WatchVerify reads the last verify run every interval into the metrics
// (tidemark_verify_tables) until ctx is done; it returns nil then. A failed
// read is shown on the page, not fatal.
func (p *Page) WatchVerify(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		run, ok, err := p.src.LastVerify(rctx)
		cancel()
		if err == nil && ok && p.src.OnVerify != nil {
			p.src.OnVerify(run)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *Page) refresh() time.Duration {
	if p.Refresh <= 0 {
		return 5 * time.Second
	}
	return p.Refresh
}

// pageMode names a table's mode on the page: streaming, snapshot,
// catch-up or quarantined.
func pageMode(recorded string, catchingUp bool) string {
	switch tidemark.TableMode(recorded) {
	case tidemark.TableSnapshotting, tidemark.TableResyncRequested:
		return "snapshot"
	case tidemark.TableQuarantined:
		return "quarantined"
	}
	if catchingUp {
		return "catch-up"
	}
	return recorded
}

// ServeHTTP renders the page.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := p.data(r.Context())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := pageTemplate.Execute(w, d); err != nil {
		http.Error(w, "render status page: "+err.Error(), http.StatusInternalServerError)
	}
}

var pageTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"t": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"lag": func(l *float64) string {
		if l == nil {
			return "–"
		}
		return (time.Duration(*l * float64(time.Second))).Round(time.Millisecond).String()
	},
	"rows": func(n int64) string {
		if n < 0 {
			return "?"
		}
		return fmt.Sprint(n)
	},
	"ts": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tidemark · {{.Identity.Name}}</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#12324a;color:#fff;padding:12px 24px;display:flex;justify-content:space-between;align-items:baseline}
header h1{margin:0;font-size:20px} header span{opacity:.8;font-size:12px}
main{padding:16px 24px;display:grid;grid-template-columns:repeat(auto-fit,minmax(300px,1fr));gap:16px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px 16px}
section.wide{grid-column:1/-1}
h2{font-size:13px;text-transform:uppercase;letter-spacing:.05em;color:#5a6577;margin:0 0 8px}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{font-weight:600;color:#5a6577;font-size:12px} td.n{text-align:right;font-variant-numeric:tabular-nums}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0} dt{color:#5a6577} dd{margin:0;font-variant-numeric:tabular-nums;word-break:break-all}
.big{font-size:22px;font-weight:600}
.mode{display:inline-block;padding:0 8px;border-radius:10px;font-size:12px;font-weight:600}
.m-streaming{background:#dff3e4;color:#17663a}.m-snapshot,.m-catch-up{background:#e3ecfb;color:#1f4f99}.m-quarantined{background:#fde2e1;color:#9b1c1c}
.ok{color:#17663a;font-weight:600}.bad{color:#9b1c1c;font-weight:600}.warn{color:#8a5a00;font-weight:600}
.err{font-family:ui-monospace,monospace;font-size:12px}
</style>
</head>
<body>
<header><h1>tidemark · {{.Identity.Name}}</h1><span>generated <span id="generated">{{ts .Generated}}</span> · refreshes every {{.Refresh}}s · up {{.Uptime}} · {{.Identity.Version}}</span></header>
<main>
<section>
<h2>Source</h2>
<dl>
<dt>name</dt><dd id="source-name">{{.Identity.Name}}</dd>
<dt>flavor</dt><dd id="source-flavor">{{.Identity.Flavor}}</dd>
<dt>address</dt><dd id="source-addr">{{.Identity.Addr}}</dd>
<dt>replica server_id</dt><dd id="source-server-id">{{.Identity.ServerID}}</dd>
<dt>checkpoint</dt><dd id="checkpoint">{{if .Report}}{{with .Report.Checkpoint}}{{.}}{{else}}(none yet){{end}}{{else}}–{{end}}</dd>
{{if .Report}}<dt>clock skew</dt><dd>source − target = {{printf "%.1f" .Report.ClockSkewSeconds}}s</dd>{{end}}
</dl>
{{with .ReportErr}}<p class="bad" id="report-error">{{.}}</p>{{end}}
</section>
<section>
<h2>Binlog retention</h2>
{{if and .Report .Report.Retention}}{{with .Report.Retention}}
<div class="big {{if .Purged}}bad{{end}}" id="headroom">{{.Headroom}}</div>
<dl>
<dt>checkpoint's file</dt><dd id="retention-file">{{.File}}</dd>
<dt>files on server</dt><dd>{{.Files}} (oldest {{.Oldest}})</dd>
<dt>expiry</dt><dd>{{if .Unbounded}}never{{else}}{{.ExpireSeconds}}s{{end}}</dd>
{{if .PurgeAfter}}<dt>purgeable after</dt><dd>{{t .PurgeAfter}}</dd>{{end}}
</dl>{{end}}
{{else}}<div class="big warn" id="headroom">unknown</div>{{if .Report}}<p>{{.Report.RetentionError}}</p>{{end}}{{end}}
</section>
<section>
<h2>End-to-end lag</h2>
<div class="big" id="max-lag">{{with .MaxLag}}{{.}}{{else}}–{{end}}</div>
<dl>
<dt>largest table lag</dt><dd>source commit → target commit of the newest row</dd>
<dt>last batch</dt><dd id="last-batch">{{with .LastBatch}}{{.}}{{else}}none yet{{end}}</dd>
<dt>last batch lag</dt><dd id="last-lag">{{with .LastLag}}{{.}}{{else}}–{{end}}</dd>
</dl>
</section>
<section>
<h2>Throughput</h2>
<div class="big"><span id="rate">{{.Rate}}</span> changes/s</div>
<table>
<tr><th>since start</th><th class="n">changes</th></tr>
<tr><td>inserted</td><td class="n" id="applied-inserted">{{.Applied.Inserted}}</td></tr>
<tr><td>updated</td><td class="n" id="applied-updated">{{.Applied.Updated}}</td></tr>
<tr><td>deleted</td><td class="n" id="applied-deleted">{{.Applied.Deleted}}</td></tr>
<tr><td>skipped (version guard)</td><td class="n" id="applied-skipped">{{.Applied.Skipped}}</td></tr>
<tr><td>coalesced</td><td class="n" id="applied-coalesced">{{.Applied.Coalesced}}</td></tr>
<tr><td><b>total</b> in <span id="batches">{{.Batches}}</span> batches</td><td class="n" id="applied-total"><b>{{.Total}}</b></td></tr>
</table>
</section>
<section>
<h2>Dedupe window</h2>
{{if .Dedupe}}<table>{{range .Dedupe}}<tr><td>{{.Name}}</td><td class="n" id="dedupe-{{.Name}}">{{.Value}}</td></tr>{{end}}</table>{{else}}<p>off</p>{{end}}
</section>
<section>
<h2>Last verify</h2>
{{with .Verify}}
<div class="big {{if eq .Verdict "equal"}}ok{{else}}bad{{end}}" id="verify-verdict">{{.Verdict}}</div>
<dl>
<dt>finished</dt><dd id="verify-time">{{ts .FinishedAt}}</dd>
<dt>tables</dt><dd id="verify-tables">{{.Tables}}</dd>
<dt>differing</dt><dd id="verify-differing">{{.Differing}}</dd>
<dt>not verified</dt><dd>{{.Errors}}</dd>
</dl>
{{with .Summary}}<p class="err" id="verify-summary">{{.}}</p>{{end}}
{{else}}<div class="big warn" id="verify-verdict">never run</div><p>run <code>tidemark verify --config …</code>; its result is kept in the target.</p>{{end}}
{{with .VerifyErr}}<p class="bad">{{.}}</p>{{end}}
</section>
<section class="wide">
<h2>Tables</h2>
{{if .Report}}<table id="tables">
<tr><th>table</th><th>mode</th><th class="n">rows (est.)</th><th>last source commit</th><th>last target commit</th><th class="n">lag</th><th>reason</th></tr>
{{range .Report.Tables}}<tr data-table="{{.Table}}"><td>{{.Table}}</td><td><span class="mode m-{{.Mode}}" data-mode="{{.Mode}}">{{.Mode}}</span></td><td class="n">{{rows .Rows}}</td><td>{{t .LastCommit}}</td><td>{{t .LastLoaded}}</td><td class="n" data-lag>{{lag .LagSeconds}}</td><td data-reason>{{.Reason}}</td></tr>
{{end}}</table>{{else}}<p>–</p>{{end}}
</section>
<section class="wide">
<h2>Recent warnings and errors</h2>
{{if .Recent}}<table id="recent">
<tr><th>time</th><th>level</th><th>message</th></tr>
{{range .Recent}}<tr><td>{{ts .Time}}</td><td class="{{if eq .Level "ERROR"}}bad{{else}}warn{{end}}">{{.Level}}</td><td><b>{{.Message}}</b> <span class="err">{{.Attrs}}</span></td></tr>
{{end}}</table>{{else}}<p id="recent">none since the start</p>{{end}}
</section>
</main>
</body>
</html>
`))
