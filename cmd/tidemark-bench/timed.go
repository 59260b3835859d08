package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"tidemark"
	"tidemark/fallback"
)

// callTimes adds up the time spent in each call of a catch-up's source and
// target: where a short catch-up's time goes.
type callTimes struct {
	mu sync.Mutex
	d  map[string]time.Duration
	n  map[string]int
}

func (c *callTimes) add(name string, t0 time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.d == nil {
		c.d, c.n = map[string]time.Duration{}, map[string]int{}
	}
	c.d[name] += time.Since(t0)
	c.n[name]++
}

func (c *callTimes) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.d, c.n = nil, nil
}

func (c *callTimes) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for k := range c.d {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return c.d[names[i]] > c.d[names[j]] })
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %s×%d", k, c.d[k].Round(100*time.Microsecond), c.n[k]))
	}
	return strings.Join(parts, ", ")
}

// timedSource times a SnapshotSource's calls.
type timedSource struct {
	tidemark.SnapshotSource
	t *callTimes
}

func (s timedSource) Capture(ctx context.Context) (tidemark.Snapshot, error) {
	defer s.t.add("source.Capture", time.Now())
	return s.SnapshotSource.Capture(ctx)
}

func (s timedSource) Table(ctx context.Context, id tidemark.TableID) (*tidemark.Table, error) {
	defer s.t.add("source.Table", time.Now())
	return s.SnapshotSource.Table(ctx, id)
}

func (s timedSource) MaxTime(ctx context.Context, id tidemark.TableID, col string) (time.Time, bool, error) {
	defer s.t.add("source.MaxTime", time.Now())
	return s.SnapshotSource.MaxTime(ctx, id, col)
}

func (s timedSource) Read(ctx context.Context, req tidemark.ReadRequest) (tidemark.ReadResult, error) {
	defer s.t.add("source.Read", time.Now())
	return s.SnapshotSource.Read(ctx, req)
}

// timedTarget times a catch-up target's calls.
type timedTarget struct {
	fallback.Target
	t *callTimes
}

func (s timedTarget) Apply(ctx context.Context, b *tidemark.Batch) (tidemark.ApplyStats, error) {
	defer s.t.add("target.Apply", time.Now())
	return s.Target.Apply(ctx, b)
}

func (s timedTarget) Watermark(ctx context.Context, source string, id tidemark.TableID) (time.Time, bool, error) {
	defer s.t.add("target.Watermark", time.Now())
	return s.Target.Watermark(ctx, source, id)
}

func (s timedSource) KeyChunk(ctx context.Context, id tidemark.TableID, after []any, limit int) (tidemark.KeyChunk, error) {
	defer s.t.add("source.KeyChunk", time.Now())
	return s.SnapshotSource.KeyChunk(ctx, id, after, limit)
}

func (s timedSource) KeyRangeSum(ctx context.Context, id tidemark.TableID, after, upTo []any) (tidemark.KeySum, error) {
	defer s.t.add("source.KeyRangeSum", time.Now())
	return s.SnapshotSource.KeyRangeSum(ctx, id, after, upTo)
}

// timedKeys times a key diff's target calls.
type timedKeys struct {
	tidemark.KeyTarget
	t *callTimes
}

func (s timedKeys) KeyRangeSum(ctx context.Context, table *tidemark.Table, after, upTo []any) (tidemark.KeySum, error) {
	defer s.t.add("target.KeyRangeSum", time.Now())
	return s.KeyTarget.KeyRangeSum(ctx, table, after, upTo)
}

func (s timedKeys) KeysInRange(ctx context.Context, table *tidemark.Table, after, upTo []any) ([][]any, error) {
	defer s.t.add("target.KeysInRange", time.Now())
	return s.KeyTarget.KeysInRange(ctx, table, after, upTo)
}
