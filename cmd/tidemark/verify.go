package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"tidemark"
	"tidemark/binlog"
	"tidemark/checkpoint"
	"tidemark/sink/postgres"
)

// VerifyConfig is the `verify:` section of the config.
type VerifyConfig struct {
	// ChunkRows is the number of source rows per checksum chunk (default
	// 10000).
	ChunkRows int `yaml:"chunk_rows"`
	// Examples is how many missing, extra, changed and duplicate keys are
	// listed per table (default 10).
	Examples int `yaml:"examples"`
	// Tables configures the daily reconciliation per "db.table".
	Tables map[string]VerifyTableConfig `yaml:"tables"`
	// Assert configures the post-load duplicate-key assertion.
	Assert AssertConfig `yaml:"assert"`
}

// VerifyTableConfig is the daily reconciliation of one table.
type VerifyTableConfig struct {
	// EventTime is the DATETIME or TIMESTAMP column that --since filters
	// on and the daily totals group by (per UTC day).
	EventTime string `yaml:"event_time"`
	// Sums lists the integer or DECIMAL columns whose SUM is compared per
	// day (COUNT(*) always is).
	Sums []string `yaml:"sums"`
}

// AssertConfig configures the post-load assertion.
type AssertConfig struct {
	// OnViolation is "stop" (default: the pipeline stops with the error)
	// or "alert" (log an error and count it in tidemark_errors_total).
	OnViolation string `yaml:"on_violation"`
	// Interval is how often the assertion runs while streaming (default
	// 5m; a negative value disables the scheduled run).
	Interval time.Duration `yaml:"interval"`
}

const (
	assertStop  = "stop"
	assertAlert = "alert"
)

func (c VerifyConfig) withDefaults() VerifyConfig {
	if c.ChunkRows <= 0 {
		c.ChunkRows = 10000
	}
	if c.Examples <= 0 {
		c.Examples = 10
	}
	if c.Assert.OnViolation == "" {
		c.Assert.OnViolation = assertStop
	}
	if c.Assert.Interval == 0 {
		c.Assert.Interval = 5 * time.Minute
	}
	return c
}

// Validate checks the section; errors name the field.
func (c VerifyConfig) Validate() error {
	var errs []error
	if c.ChunkRows < 0 {
		errs = append(errs, errors.New("config: verify.chunk_rows: must be ≥ 0"))
	}
	if c.Examples < 0 {
		errs = append(errs, errors.New("config: verify.examples: must be ≥ 0"))
	}
	switch c.Assert.OnViolation {
	case "", assertStop, assertAlert:
	default:
		errs = append(errs, fmt.Errorf("config: verify.assert.on_violation: must be %s or %s, got %q", assertStop, assertAlert, c.Assert.OnViolation))
	}
	for k, t := range c.Tables {
		if strings.Count(k, ".") != 1 {
			errs = append(errs, fmt.Errorf("config: verify.tables: key %q must be db.table", k))
		}
		if t.EventTime == "" && len(t.Sums) > 0 {
			errs = append(errs, fmt.Errorf("config: verify.tables.%s.event_time: required with sums", k))
		}
		if t.EventTime != "" && !tidemark.ValidIdentifier(t.EventTime) {
			errs = append(errs, fmt.Errorf("config: verify.tables.%s.event_time: invalid column %q", k, t.EventTime))
		}
		for _, s := range t.Sums {
			if !tidemark.ValidIdentifier(s) {
				errs = append(errs, fmt.Errorf("config: verify.tables.%s.sums: invalid column %q", k, s))
			}
		}
	}
	return errors.Join(errs...)
}

// Verdicts of a table and their exit codes.
const (
	verdictEqual     = "equal"
	verdictDifferent = "different"
	verdictError     = "error"

	exitVerifyEqual     = 0
	exitVerifyDifferent = 1
	exitVerifyError     = 2
)

// ColumnDiff is one column of a changed row.
type ColumnDiff struct {
	Column string  `json:"column"`
	Source *string `json:"source"`
	Target *string `json:"target"`
}

// ChangedRow is a key present on both sides with different values.
type ChangedRow struct {
	Key     []string     `json:"key"`
	Columns []ColumnDiff `json:"columns,omitempty"`
}

// DayDiff is one UTC day whose totals differ.
type DayDiff struct {
	Day          string   `json:"day"`
	SourceCount  int64    `json:"source_count"`
	TargetCount  int64    `json:"target_count"`
	SourceSums   []string `json:"source_sums,omitempty"`
	TargetSums   []string `json:"target_sums,omitempty"`
	DifferingSum []string `json:"differing_sums,omitempty"`
}

// TableReport is the verification of one table.
type TableReport struct {
	Table           string                  `json:"table"`
	Target          string                  `json:"target"`
	Verdict         string                  `json:"verdict"`
	Error           string                  `json:"error,omitempty"`
	SourceRows      int64                   `json:"source_rows"`
	TargetRows      int64                   `json:"target_rows"`
	Chunks          int                     `json:"chunks"`
	ChunksDiffering int                     `json:"chunks_differing"`
	Missing         int                     `json:"missing"`
	Extra           int                     `json:"extra"`
	Changed         int                     `json:"changed"`
	MissingKeys     [][]string              `json:"missing_keys,omitempty"`
	ExtraKeys       [][]string              `json:"extra_keys,omitempty"`
	ChangedRows     []ChangedRow            `json:"changed_rows,omitempty"`
	DuplicateKeys   int64                   `json:"duplicate_keys"`
	Duplicates      []tidemark.DuplicateKey `json:"duplicates,omitempty"`
	Sums            []string                `json:"sums,omitempty"`
	Days            int                     `json:"days,omitempty"`
	DaysDiffering   []DayDiff               `json:"days_differing,omitempty"`
	Since           *time.Time              `json:"since,omitempty"`
	Seconds         float64                 `json:"seconds"`
}

// VerifyReport is the output of `tidemark verify`.
type VerifyReport struct {
	Source  string        `json:"source"`
	Verdict string        `json:"verdict"`
	Tables  []TableReport `json:"tables"`
}

// ExitCode returns 0 when every table is equal, 2 when any table could not
// be verified, else 1.
func (r *VerifyReport) ExitCode() int {
	code := exitVerifyEqual
	for _, t := range r.Tables {
		switch t.Verdict {
		case verdictError:
			return exitVerifyError
		case verdictDifferent:
			code = exitVerifyDifferent
		}
	}
	return code
}

// verifyEngine compares one table chunk by chunk: counts and checksums
// computed in each database; keys and row hashes only for chunks that
// differ (and for every chunk of a table with float or JSON columns, which
// are compared in Go).
type verifyEngine struct {
	src       tidemark.SourceVerifier
	dst       tidemark.TargetVerifier
	chunkRows int
	examples  int
	// progress, if set, is told the source rows of every chunk checked.
	progress func(rows int64)
	json     jsonComparer
}

// both runs the source and the target part of a step concurrently.
func both(f, g func() error) error {
	var wg sync.WaitGroup
	var e1, e2 error
	wg.Add(1)
	go func() { defer wg.Done(); e1 = f() }()
	e2 = g()
	wg.Wait()
	return errors.Join(e1, e2)
}

func keyString(k []string) string { return strings.Join(k, "\x00") }

// goCanon returns the canonical text of a Go-compared value; NULL is "\x00".
func goCanon(kind tidemark.Kind, v *string) string {
	if v == nil {
		return "\x00"
	}
	switch kind {
	case tidemark.KindFloat:
		f, err := strconv.ParseFloat(*v, 64)
		if err != nil {
			return *v
		}
		return strconv.FormatFloat(float64(float32(f)), 'g', -1, 32)
	case tidemark.KindDouble:
		f, err := strconv.ParseFloat(*v, 64)
		if err != nil {
			return *v
		}
		return strconv.FormatFloat(f, 'g', -1, 64)
	case tidemark.KindJSON:
		return canonicalJSON(*v)
	}
	return *v
}

// canonicalJSON re-encodes a JSON document with object keys sorted, no
// insignificant space, and numbers as exact rationals (2.50 = 2.5 = 25e-1),
// so MariaDB's text and PostgreSQL's jsonb text compare equal when they
// hold the same document. Invalid JSON is returned unchanged.
func canonicalJSON(s string) string {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return s
	}
	var b strings.Builder
	var enc func(v any)
	enc = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				kb, _ := json.Marshal(k)
				b.Write(kb)
				b.WriteByte(':')
				enc(x[k])
			}
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range x {
				if i > 0 {
					b.WriteByte(',')
				}
				enc(e)
			}
			b.WriteByte(']')
		case json.Number:
			if r, ok := new(big.Rat).SetString(string(x)); ok && len(x) < 400 {
				b.WriteString(r.RatString())
			} else {
				b.WriteString(string(x))
			}
		default:
			eb, _ := json.Marshal(x)
			b.Write(eb)
		}
	}
	enc(v)
	return b.String()
}

// sameDigest compares two rows' hashes and Go-compared values.
func (e *verifyEngine) sameDigest(spec *tidemark.VerifySpec, goCols []int, a, b tidemark.RowDigest) bool {
	if a.Hash != b.Hash {
		return false
	}
	for j, ci := range goCols {
		if !e.sameGo(spec.Table.Columns[ci].Kind, a.Go[j], b.Go[j]) {
			return false
		}
	}
	return true
}

// sameGo compares one Go-compared value of both sides (nil is NULL).
func (e *verifyEngine) sameGo(kind tidemark.Kind, a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if kind == tidemark.KindJSON {
		return e.json.equal(*a, *b)
	}
	return goCanon(kind, a) == goCanon(kind, b)
}

// table verifies one table. It never returns an error: failures are the
// report's Error with verdict "error".
func (e *verifyEngine) table(ctx context.Context, spec *tidemark.VerifySpec, sums []string) *TableReport {
	start := time.Now()
	rep := &TableReport{Table: spec.Table.ID.String(), Target: spec.TargetSchema + "." + spec.Table.ID.Name, Sums: sums}
	if spec.EventTime != "" && !spec.Since.IsZero() {
		s := spec.Since.UTC()
		rep.Since = &s
	}
	if err := e.run(ctx, spec, sums, rep); err != nil {
		rep.Verdict = verdictError
		rep.Error = err.Error()
	} else if rep.SourceRows == rep.TargetRows && rep.Missing == 0 && rep.Extra == 0 && rep.Changed == 0 &&
		rep.DuplicateKeys == 0 && len(rep.DaysDiffering) == 0 {
		rep.Verdict = verdictEqual
	} else {
		rep.Verdict = verdictDifferent
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep
}

func (e *verifyEngine) run(ctx context.Context, spec *tidemark.VerifySpec, sums []string, rep *TableReport) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	for _, name := range sums {
		i := spec.Table.ColumnIndex(name)
		if i < 0 {
			return fmt.Errorf("verify %s: verify.tables.%s.sums: column %q not in table", spec.Table.ID, spec.Table.ID, name)
		}
		switch spec.Table.Columns[i].Kind {
		case tidemark.KindInt, tidemark.KindUint, tidemark.KindDecimal, tidemark.KindYear:
		default:
			return fmt.Errorf("verify %s: verify.tables.%s.sums: column %q is %s; only integer and DECIMAL sums compare exactly", spec.Table.ID, spec.Table.ID, name, spec.Table.Columns[i].Kind)
		}
	}
	goCols := spec.GoColumns()
	// Rows only one side has, over all chunks: a row whose key orders
	// differently near a chunk bound (a DST fold) shows up in two chunks
	// and is matched here.
	srcOnly := map[string]tidemark.RowDigest{}
	dstOnly := map[string]tidemark.RowDigest{}
	var changed [][]string
	// The duplicate-key assertion is one aggregate over the target table:
	// it runs alongside the chunks.
	type dupResult struct {
		rep tidemark.DuplicateReport
		err error
	}
	dups := make(chan dupResult, 1)
	go func() { // owned: waited for below or on the way out
		r, err := e.dst.DuplicateKeys(ctx, spec, time.Time{}, e.examples)
		dups <- dupResult{r, err}
	}()
	defer func() {
		if dups != nil {
			<-dups
		}
	}()
	// Chunks are read ahead of the comparison, verifyParallel at a time,
	// and compared in key order.
	fctx, cancel := context.WithCancel(ctx)
	chunks := make(chan chan verifyChunk, verifyParallel)
	fetched := make(chan struct{})
	go func() { // owned: run waits for it below
		defer close(fetched)
		defer close(chunks)
		e.fetchChunks(fctx, spec, len(goCols) > 0, chunks)
	}()
	defer func() {
		cancel()
		for range chunks {
		}
		<-fetched
	}()
	for f := range chunks {
		c := <-f
		if c.err != nil {
			return c.err
		}
		sc, tc, sd, td := c.sc, c.tc, c.sd, c.td
		rep.Chunks++
		rep.SourceRows += sc.Rows
		rep.TargetRows += tc.Rows
		if e.progress != nil {
			e.progress(sc.Rows)
		}
		if !c.digests {
			continue
		}
		differs := sc != tc
		// Both sides list rows in key order: walk them in step while the
		// keys agree, and match the rest (a row only one side has, or
		// keys the two databases order differently) by key.
		i := 0
		for ; i < len(sd) && i < len(td) && slices.Equal(sd[i].Key, td[i].Key); i++ {
			if !e.sameDigest(spec, goCols, sd[i], td[i]) {
				changed = append(changed, sd[i].Key)
				differs = true
			}
		}
		if i < len(sd) || i < len(td) {
			tmap := make(map[string]tidemark.RowDigest, len(td)-i)
			for _, d := range td[i:] {
				tmap[keyString(d.Key)] = d
			}
			for _, d := range sd[i:] {
				k := keyString(d.Key)
				t, ok := tmap[k]
				if !ok {
					srcOnly[k] = d
					differs = true
					continue
				}
				delete(tmap, k)
				if !e.sameDigest(spec, goCols, d, t) {
					changed = append(changed, d.Key)
					differs = true
				}
			}
			for k, d := range tmap {
				dstOnly[k] = d
				differs = true
			}
		}
		if differs {
			rep.ChunksDiffering++
		}
	}
	if err := ctx.Err(); err != nil {
		return err // the fetcher stops without a word when ctx is done
	}
	for k, s := range srcOnly {
		if t, ok := dstOnly[k]; ok {
			delete(dstOnly, k)
			if !e.sameDigest(spec, goCols, s, t) {
				changed = append(changed, s.Key)
			}
			continue
		}
		rep.Missing++
		rep.MissingKeys = append(rep.MissingKeys, s.Key)
	}
	for _, d := range dstOnly {
		rep.Extra++
		rep.ExtraKeys = append(rep.ExtraKeys, d.Key)
	}
	rep.Changed = len(changed)
	rep.MissingKeys = firstKeys(rep.MissingKeys, e.examples)
	rep.ExtraKeys = firstKeys(rep.ExtraKeys, e.examples)
	changed = firstKeys(changed, e.examples)
	if len(changed) > 0 {
		if err := e.describeChanged(ctx, spec, changed, rep); err != nil {
			return err
		}
	}
	d := <-dups
	dups = nil
	if d.err != nil {
		return d.err
	}
	rep.DuplicateKeys, rep.Duplicates = d.rep.Groups, d.rep.Examples
	if spec.EventTime != "" {
		if err := e.daily(ctx, spec, sums, rep); err != nil {
			return err
		}
	}
	return nil
}

// verifyChunk is one chunk's counts and, when read, its row digests.
type verifyChunk struct {
	sc, tc  tidemark.ChunkChecksum
	sd, td  []tidemark.RowDigest
	digests bool
	err     error
}

// verifyParallel is the chunks read at once: each database then works on
// two queries (two cores on the machine measured), while Go compares a
// third. Bounds are found one after the other (a bound needs the previous).
const verifyParallel = 2

// fetchChunks reads the table chunk by chunk and sends each chunk's
// result, in key order, on out; it ends after the last chunk, after an
// error (sent as the last result) or when ctx is done. A table with
// Go-compared columns reads every chunk's digests: their count is the
// chunk's row count, and a checksum pass would read it twice.
func (e *verifyEngine) fetchChunks(ctx context.Context, spec *tidemark.VerifySpec, goCompared bool, out chan<- chan verifyChunk) {
	var wg sync.WaitGroup
	defer wg.Wait() // owned: every chunk's reader ends before fetchChunks
	slots := make(chan struct{}, verifyParallel)
	send := func(f chan verifyChunk) bool {
		select {
		case out <- f:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) {
		f := make(chan verifyChunk, 1)
		f <- verifyChunk{err: err}
		send(f)
	}
	var lo []string
	for {
		if err := ctx.Err(); err != nil {
			fail(err)
			return
		}
		r := tidemark.KeyRange{Lo: lo}
		last := true
		if spec.Chunked() {
			hi, ok, err := e.src.NextBound(ctx, spec, lo, e.chunkRows)
			if err != nil {
				fail(err)
				return
			}
			if ok {
				r.Hi, last = hi, false
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			fail(ctx.Err())
			return
		}
		f := make(chan verifyChunk, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			f <- e.fetchChunk(ctx, spec, goCompared, r)
		}()
		if !send(f) || last {
			return
		}
		lo = r.Hi
	}
}

// fetchChunk reads one chunk: both sides' checksums, and their digests
// when the checksums differ or the table has Go-compared columns.
func (e *verifyEngine) fetchChunk(ctx context.Context, spec *tidemark.VerifySpec, goCompared bool, r tidemark.KeyRange) verifyChunk {
	c := verifyChunk{digests: goCompared}
	if !goCompared {
		c.err = both(func() (err error) { c.sc, err = e.src.Checksum(ctx, spec, r); return },
			func() (err error) { c.tc, err = e.dst.Checksum(ctx, spec, r); return })
		c.digests = c.err == nil && c.sc != c.tc
	}
	if c.digests {
		c.err = both(func() (err error) { c.sd, err = e.src.Digests(ctx, spec, r); return },
			func() (err error) { c.td, err = e.dst.Digests(ctx, spec, r); return })
		if goCompared {
			c.sc.Rows, c.tc.Rows = int64(len(c.sd)), int64(len(c.td))
		}
	}
	return c
}

// firstKeys sorts keys (by their text) and keeps the first n.
func firstKeys(keys [][]string, n int) [][]string {
	sort.Slice(keys, func(i, j int) bool { return keyString(keys[i]) < keyString(keys[j]) })
	if len(keys) > n {
		keys = keys[:n]
	}
	return keys
}

// describeChanged reads the changed rows on both sides and lists the
// columns that differ.
func (e *verifyEngine) describeChanged(ctx context.Context, spec *tidemark.VerifySpec, keys [][]string, rep *TableReport) error {
	var srows, trows map[string][]*string
	err := both(func() (err error) { srows, err = e.src.Rows(ctx, spec, keys); return },
		func() (err error) { trows, err = e.dst.Rows(ctx, spec, keys); return })
	if err != nil {
		return err
	}
	for _, k := range keys {
		cr := ChangedRow{Key: k}
		s, t := srows[keyString(k)], trows[keyString(k)]
		if s != nil && t != nil {
			for i, c := range spec.Table.Columns {
				if !e.sameGo(c.Kind, s[i], t[i]) {
					cd := ColumnDiff{Column: c.Name, Source: s[i], Target: t[i]}
					if c.Kind == tidemark.KindDateTime {
						cd.Source, cd.Target = annotateZone(s[i], spec.Zone(c.Name)), annotateZone(t[i], spec.Zone(c.Name))
					}
					cr.Columns = append(cr.Columns, cd)
				}
			}
		}
		rep.ChangedRows = append(rep.ChangedRows, cr)
	}
	return nil
}

// annotateZone adds the UTC instant to a DATETIME's wall-clock text:
// "2026-03-10 23:58:00.000000 Asia/Kolkata = 2026-03-10T18:28:00Z".
func annotateZone(v *string, zone string) *string {
	if v == nil {
		return nil
	}
	s := *v + " " + zone
	if loc, err := time.LoadLocation(zone); err == nil {
		if wall, err := time.Parse("2006-01-02 15:04:05.000000", *v); err == nil {
			if u, err := (tidemark.ZonePolicy{Location: loc, Fold: tidemark.ResolveLater, Gap: tidemark.ResolveLater}).ToUTC(wall); err == nil {
				s += " = " + u.Format(time.RFC3339Nano)
			}
		}
	}
	return &s
}

// daily compares COUNT(*) and the configured SUMs per UTC day.
func (e *verifyEngine) daily(ctx context.Context, spec *tidemark.VerifySpec, sums []string, rep *TableReport) error {
	var sd, td []tidemark.DayTotals
	err := both(func() (err error) { sd, err = e.src.DailyTotals(ctx, spec, sums); return },
		func() (err error) { td, err = e.dst.DailyTotals(ctx, spec, sums); return })
	if err != nil {
		return err
	}
	days := map[string]*DayDiff{}
	var order []string
	get := func(d string) *DayDiff {
		if x, ok := days[d]; ok {
			return x
		}
		x := &DayDiff{Day: d, SourceSums: make([]string, len(sums)), TargetSums: make([]string, len(sums))}
		days[d] = x
		order = append(order, d)
		return x
	}
	for _, d := range sd {
		x := get(d.Day)
		x.SourceCount, x.SourceSums = d.Count, d.Sums
	}
	for _, d := range td {
		x := get(d.Day)
		x.TargetCount, x.TargetSums = d.Count, d.Sums
	}
	sort.Strings(order)
	rep.Days = len(order)
	for _, d := range order {
		x := days[d]
		for i, name := range sums {
			if !sameDecimal(x.SourceSums[i], x.TargetSums[i]) {
				x.DifferingSum = append(x.DifferingSum, name)
			}
		}
		if x.SourceCount != x.TargetCount || len(x.DifferingSum) > 0 {
			rep.DaysDiffering = append(rep.DaysDiffering, *x)
		}
	}
	return nil
}

// sameDecimal compares two exact decimal texts ("" is NULL).
func sameDecimal(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	x, ok1 := new(big.Rat).SetString(a)
	y, ok2 := new(big.Rat).SetString(b)
	if !ok1 || !ok2 {
		return a == b
	}
	return x.Cmp(y) == 0
}

// verifyTableList is a repeatable --table flag (also comma-separated).
type verifyTableList []string

func (l *verifyTableList) String() string { return strings.Join(*l, ",") }
func (l *verifyTableList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// zoneOf returns the IANA zone of a DATETIME column from the config (as the
// tailer resolves it: column override, table override, source zone).
func zoneOf(bc binlog.Config, id tidemark.TableID, column string) string {
	z := bc.Zone.Location
	if o, ok := bc.ZoneOverrides[id.String()]; ok && o.Location != nil {
		z = o.Location
	}
	if o, ok := bc.ZoneOverrides[id.String()+"."+column]; ok && o.Location != nil {
		z = o.Location
	}
	if z == nil {
		return "UTC"
	}
	return z.String()
}

// verifySpec builds the spec of one table from its source schema and the
// config.
func verifySpec(t *tidemark.Table, bc binlog.Config, targetSchema string, vc VerifyConfig, since, until time.Time) (*tidemark.VerifySpec, []string) {
	spec := &tidemark.VerifySpec{Table: t, TargetSchema: targetSchema, Zones: map[string]string{}}
	if spec.TargetSchema == "" {
		spec.TargetSchema = t.ID.Database
	}
	for _, c := range t.Columns {
		if c.Kind == tidemark.KindDateTime {
			spec.Zones[c.Name] = zoneOf(bc, t.ID, c.Name)
		}
	}
	tc := vc.Tables[t.ID.String()]
	spec.EventTime = tc.EventTime
	if spec.EventTime != "" && !since.IsZero() {
		spec.Since, spec.Until = since, until
	}
	return spec, tc.Sums
}

// cmdVerify implements `tidemark verify [--table db.t]... [--since D]
// [--json]`: exit 0 when source and target are equal, 1 when they differ,
// 2 on an error. section returns the config's verify section.
func cmdVerify(ctx context.Context, args []string, stdout, stderr io.Writer, section func(*Config) VerifyConfig) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "tidemark.yaml", "path to the YAML config")
	var tables verifyTableList
	fs.Var(&tables, "table", "verify only this db.table (repeatable, or comma-separated)")
	since := fs.Duration("since", 0, "compare only rows whose event-time column (verify.tables.T.event_time) is within this duration of now; tables without one are compared whole")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	chunkRows := fs.Int("chunk-rows", 0, "source rows per checksum chunk (default verify.chunk_rows, 10000)")
	examples := fs.Int("examples", 0, "keys listed per kind of difference (default verify.examples, 10)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the verification to this file")
	if err := fs.Parse(args); err != nil {
		return exitVerifyError
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "tidemark:", err)
			return exitVerifyError
		}
		defer stop()
	}
	cfg, err := LoadConfig(*path)
	if err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitVerifyError
	}
	if err := cfg.needPostgres("verify"); err != nil {
		fmt.Fprintln(stderr, err)
		return exitVerifyError
	}
	vc := VerifyConfig{}
	if section != nil {
		vc = section(cfg)
	}
	if err := vc.Validate(); err != nil {
		fmt.Fprintln(stderr, "tidemark:", err)
		return exitVerifyError
	}
	vc = vc.withDefaults()
	if *chunkRows > 0 {
		vc.ChunkRows = *chunkRows
	}
	if *examples > 0 {
		vc.Examples = *examples
	}
	if *since < 0 {
		fmt.Fprintln(stderr, "tidemark: verify: --since must be positive")
		return exitVerifyError
	}
	log := newLogger(cfg.Log, stderr)
	rep, err := runVerify(ctx, cfg, vc, tables, *since, log, stderr)
	if err != nil {
		log.Error("verify failed", "err", err)
		return exitVerifyError
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return exitVerifyError
		}
	} else {
		printVerify(stdout, rep)
	}
	return rep.ExitCode()
}

// runVerify connects to both sides and verifies the tables (all the
// config includes when tables is empty).
func runVerify(ctx context.Context, cfg *Config, vc VerifyConfig, tables []string, since time.Duration, log *slog.Logger, progressOut io.Writer) (*VerifyReport, error) {
	bc, err := cfg.BinlogConfig()
	if err != nil {
		return nil, err
	}
	src, err := binlog.NewVerifier(bc)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	store, err := checkpoint.New(checkpoint.Config{Schema: cfg.Target.Postgres.ControlSchema})
	if err != nil {
		return nil, err
	}
	pc := cfg.PostgresSinkConfig()
	pc.Checkpoints = store
	pc.Logger = log.With("component", "postgres")
	pc.Retry.Attempts = 3
	sink, err := postgres.Open(ctx, pc)
	if err != nil {
		return nil, err
	}
	defer sink.Close()
	rep, err := verifyTables(ctx, src, postgres.NewVerifier(sink), bc, cfg.Target.Postgres.Schema, vc, tables, since, log, progressOut)
	if err != nil {
		return nil, err
	}
	// Kept in the target for the daemon's status page and metrics; the
	// report stands without it.
	if err := sink.RecordVerifyRun(ctx, rep.Run()); err != nil {
		log.Warn("could not record the verify run in the target", "err", err)
	}
	return rep, nil
}

// Run summarizes the report for the target's control tables.
func (r *VerifyReport) Run() tidemark.VerifyRun {
	run := tidemark.VerifyRun{Source: r.Source, Verdict: r.Verdict, Tables: len(r.Tables)}
	var parts []string
	for _, t := range r.Tables {
		switch t.Verdict {
		case verdictDifferent:
			run.Differing++
			parts = append(parts, fmt.Sprintf("%s: %d missing, %d extra, %d changed", t.Table, t.Missing, t.Extra, t.Changed))
		case verdictError:
			run.Errors++
			parts = append(parts, t.Table+": not verified")
		}
	}
	run.Summary = strings.Join(parts, "; ")
	return run
}

// verifyTables runs the engine over the tables.
func verifyTables(ctx context.Context, src tidemark.SourceVerifier, dst tidemark.TargetVerifier, bc binlog.Config, targetSchema string,
	vc VerifyConfig, tables []string, since time.Duration, log *slog.Logger, progressOut io.Writer) (*VerifyReport, error) {
	var ids []tidemark.TableID
	if len(tables) == 0 {
		var err error
		if ids, err = src.Tables(ctx); err != nil {
			return nil, err
		}
	}
	for _, t := range tables {
		db, name, ok := strings.Cut(t, ".")
		if !ok || db == "" || name == "" || strings.Contains(name, ".") {
			return nil, fmt.Errorf("verify: --table %q: want db.table", t)
		}
		ids = append(ids, tidemark.TableID{Database: db, Name: name})
	}
	now := time.Now().UTC()
	var from time.Time
	if since > 0 {
		from = now.Add(-since)
	}
	rep := &VerifyReport{Source: bc.Name, Verdict: verdictEqual}
	for _, id := range ids {
		t, err := src.Table(ctx, id)
		if err != nil {
			rep.Tables = append(rep.Tables, TableReport{Table: id.String(), Verdict: verdictError, Error: err.Error()})
			continue
		}
		spec, sums := verifySpec(t, bc, targetSchema, vc, from, now)
		bar := NewProgress(progressOut, "verify "+id.String(), -1, log)
		eng := &verifyEngine{src: src, dst: dst, chunkRows: vc.ChunkRows, examples: vc.Examples, progress: bar.Add}
		tr := eng.table(ctx, spec, sums)
		bar.Finish()
		log.Debug("verified table", "table", tr.Table, "verdict", tr.Verdict, "source_rows", tr.SourceRows, "target_rows", tr.TargetRows, "seconds", tr.Seconds)
		rep.Tables = append(rep.Tables, *tr)
	}
	switch rep.ExitCode() {
	case exitVerifyDifferent:
		rep.Verdict = verdictDifferent
	case exitVerifyError:
		rep.Verdict = verdictError
	}
	return rep, nil
}

func fmtKey(k []string) string { return "(" + strings.Join(k, ", ") + ")" }

func fmtVal(v *string) string {
	if v == nil {
		return "NULL"
	}
	return strconv.Quote(*v)
}

// printVerify writes the readable report: one line per table, then the
// details of every table that is not equal.
func printVerify(w io.Writer, rep *VerifyReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSOURCE ROWS\tTARGET ROWS\tCHUNKS\tDIFFERING\tMISSING\tEXTRA\tCHANGED\tDUP KEYS\tDAYS DIFFERING\tVERDICT")
	for _, t := range rep.Tables {
		days := "-"
		if t.Days > 0 {
			days = fmt.Sprintf("%d/%d", len(t.DaysDiffering), t.Days)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", t.Table, t.SourceRows, t.TargetRows, t.Chunks,
			t.ChunksDiffering, t.Missing, t.Extra, t.Changed, t.DuplicateKeys, days, strings.ToUpper(t.Verdict))
	}
	tw.Flush()
	for _, t := range rep.Tables {
		if t.Verdict == verdictEqual {
			continue
		}
		fmt.Fprintf(w, "\n%s → %s:\n", t.Table, t.Target)
		if t.Error != "" {
			fmt.Fprintf(w, "  error: %s\n", t.Error)
			continue
		}
		if t.SourceRows != t.TargetRows {
			fmt.Fprintf(w, "  row count: source %d, target %d\n", t.SourceRows, t.TargetRows)
		}
		for _, k := range t.MissingKeys {
			fmt.Fprintf(w, "  missing in target: %s\n", fmtKey(k))
		}
		if n := t.Missing - len(t.MissingKeys); n > 0 {
			fmt.Fprintf(w, "  … and %d more missing\n", n)
		}
		for _, k := range t.ExtraKeys {
			fmt.Fprintf(w, "  extra in target:   %s\n", fmtKey(k))
		}
		if n := t.Extra - len(t.ExtraKeys); n > 0 {
			fmt.Fprintf(w, "  … and %d more extra\n", n)
		}
		for _, c := range t.ChangedRows {
			fmt.Fprintf(w, "  changed:           %s\n", fmtKey(c.Key))
			for _, d := range c.Columns {
				fmt.Fprintf(w, "      %s: source %s, target %s\n", d.Column, fmtVal(d.Source), fmtVal(d.Target))
			}
		}
		if n := t.Changed - len(t.ChangedRows); n > 0 {
			fmt.Fprintf(w, "  … and %d more changed\n", n)
		}
		for _, d := range t.Duplicates {
			fmt.Fprintf(w, "  duplicate key:     %s held by %d rows\n", fmtKey(d.Key), d.Rows)
		}
		for _, d := range t.DaysDiffering {
			fmt.Fprintf(w, "  day %s (UTC): count source %d, target %d", d.Day, d.SourceCount, d.TargetCount)
			for i, s := range t.Sums {
				fmt.Fprintf(w, "; SUM(%s) source %s, target %s", s, orNull(d.SourceSums, i), orNull(d.TargetSums, i))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\nverdict: %s\n", strings.ToUpper(rep.Verdict))
}

func orNull(s []string, i int) string {
	if i >= len(s) || s[i] == "" {
		return "NULL"
	}
	return s[i]
}

// Asserter runs the post-load assertion: no business key is held by more
// than one target row. A violation is an error wrapping
// tidemark.ErrDuplicateKeys; with on_violation "stop" it is returned (and
// stops the pipeline), with "alert" it is logged and counted.
type Asserter struct {
	sink    *postgres.Sink
	cfg     AssertConfig
	log     *slog.Logger
	metrics *Metrics

	mu   sync.Mutex
	last time.Time // target clock at the previous scheduled run
}

// NewAsserter returns an Asserter over the tables the sink applies;
// metrics may be nil.
func NewAsserter(sink *postgres.Sink, vc VerifyConfig, log *slog.Logger, metrics *Metrics) *Asserter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Asserter{sink: sink, cfg: vc.withDefaults().Assert, log: log.With("component", "assert"), metrics: metrics}
}

// AfterLoad asserts on the keys of the rows loaded at or after since (the
// target's clock; zero: every row) in every table the sink has applied.
// Call it after each snapshot or catch-up window with the time the window
// started (Sink.Now before loading).
func (a *Asserter) AfterLoad(ctx context.Context, since time.Time) error {
	var errs []error
	for _, t := range a.sink.AppliedTables() {
		err := a.sink.AssertNoDuplicateKeys(ctx, t, since)
		if err == nil {
			continue
		}
		if !errors.Is(err, tidemark.ErrDuplicateKeys) {
			return fmt.Errorf("post-load assertion: %w", err)
		}
		if a.metrics != nil {
			a.metrics.Error(err)
		}
		if a.cfg.OnViolation == assertAlert {
			a.log.Error("post-load assertion failed (on_violation: alert, the pipeline goes on)", "err", err)
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Run asserts every Interval on the rows loaded since the previous run
// until ctx is done (returning nil) or a violation stops it (returning the
// error). It does nothing when Interval is negative.
func (a *Asserter) Run(ctx context.Context) error {
	if a.cfg.Interval < 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now, err := a.sink.Now(ctx)
		if err != nil {
			a.log.Warn("post-load assertion skipped", "err", err)
			continue
		}
		a.mu.Lock()
		since := a.last
		a.last = now
		a.mu.Unlock()
		if err := a.AfterLoad(ctx, since); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, tidemark.ErrDuplicateKeys) {
				return err
			}
			a.log.Warn("post-load assertion could not run", "err", err)
		}
	}
}
