package verify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"tidemark"
)

// engine compares one table chunk by chunk: counts and checksums
// computed in each database; keys and row hashes only for chunks that
// differ (and for every chunk of a table with float or JSON columns, which
// are compared in Go).
type engine struct {
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
func (e *engine) sameDigest(spec *tidemark.VerifySpec, goCols []int, a, b tidemark.RowDigest) bool {
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
func (e *engine) sameGo(kind tidemark.Kind, a, b *string) bool {
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
func (e *engine) table(ctx context.Context, spec *tidemark.VerifySpec, sums []string) *TableReport {
	start := time.Now()
	rep := &TableReport{Table: spec.Table.ID.String(), Target: spec.TargetSchema + "." + spec.Table.ID.Name, Sums: sums}
	if spec.EventTime != "" && !spec.Since.IsZero() {
		s := spec.Since.UTC()
		rep.Since = &s
	}
	if err := e.run(ctx, spec, sums, rep); err != nil {
		rep.Verdict = VerdictError
		rep.Error = err.Error()
	} else if rep.SourceRows == rep.TargetRows && rep.Missing == 0 && rep.Extra == 0 && rep.Changed == 0 &&
		rep.DuplicateKeys == 0 && len(rep.DaysDiffering) == 0 {
		rep.Verdict = VerdictEqual
	} else {
		rep.Verdict = VerdictDifferent
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep
}

func (e *engine) run(ctx context.Context, spec *tidemark.VerifySpec, sums []string, rep *TableReport) error {
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
	// Chunks are read ahead of the comparison, parallel at a time,
	// and compared in key order.
	fctx, cancel := context.WithCancel(ctx)
	chunks := make(chan chan chunk, parallel)
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

// chunk is one chunk's counts and, when read, its row digests.
type chunk struct {
	sc, tc  tidemark.ChunkChecksum
	sd, td  []tidemark.RowDigest
	digests bool
	err     error
}

// parallel is the chunks read at once: each database then works on
// two queries (two cores on the machine measured), while Go compares a
// third. Bounds are found one after the other (a bound needs the previous).
const parallel = 2

// fetchChunks reads the table chunk by chunk and sends each chunk's
// result, in key order, on out; it ends after the last chunk, after an
// error (sent as the last result) or when ctx is done. A table with
// Go-compared columns reads every chunk's digests: their count is the
// chunk's row count, and a checksum pass would read it twice.
func (e *engine) fetchChunks(ctx context.Context, spec *tidemark.VerifySpec, goCompared bool, out chan<- chan chunk) {
	var wg sync.WaitGroup
	defer wg.Wait() // owned: every chunk's reader ends before fetchChunks
	slots := make(chan struct{}, parallel)
	send := func(f chan chunk) bool {
		select {
		case out <- f:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) {
		f := make(chan chunk, 1)
		f <- chunk{err: err}
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
		f := make(chan chunk, 1)
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
func (e *engine) fetchChunk(ctx context.Context, spec *tidemark.VerifySpec, goCompared bool, r tidemark.KeyRange) chunk {
	c := chunk{digests: goCompared}
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
func (e *engine) describeChanged(ctx context.Context, spec *tidemark.VerifySpec, keys [][]string, rep *TableReport) error {
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
func (e *engine) daily(ctx context.Context, spec *tidemark.VerifySpec, sums []string, rep *TableReport) error {
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
