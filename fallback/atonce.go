package fallback

import (
	"context"
	"errors"
	"slices"
	"sync"

	"tidemark"
)

// Tables at once (issue 25 §2: "tables in parallel at a first run").
//
// A catch-up of every table with extra readers (SetReaders: the PostgreSQL
// target alone, snapshot.parallelism > 1) runs one worker per reader, the
// readers being the whole budget: N = snapshot.parallelism source
// connections, and as many Apply calls (PostgreSQL sessions) at a time.
// A worker takes the next table and catches it up on its own reader, as
// a run of one table would (the same capture, version and checks). A
// full read of a table is split into up to N key ranges as before; the
// worker reads the first range itself and offers the others, and a worker
// that is free takes an offered range before it starts another table, so
// that one big table among small ones still gets every reader once the
// small ones are done, and a single table is read exactly as before (N
// ranges, N readers). A range nobody took when the worker's own range is
// done is read by the worker itself.
//
// Memory stays what snapshot.parallelism states for one table: at most N
// ranges are read at a time (one per worker), each holding up to
// read_ahead + 1 chunks of chunk_rows rows, plus a key diff's chunk of
// key_chunk_rows keys per worker.
//
// Order does not matter: every table is read after the one capture, and
// its rows are stamped with the captured version; the stream resumes at
// the capture only after every table is done (run's checkpoint).
// Failures stay per table: a table the run cannot follow is quarantined
// (plan.quarantine, under the run's lock) and the workers go on with the
// others; any other error cancels the run, which returns it.

// readerCount is the number of readers a full read of one table is split
// for.
func (c *CatchUp) readerCount() int {
	if c.pool != nil {
		return c.pool.workers
	}
	return 1 + len(c.readers)
}

// tablesAtOnce reports whether run catches the tables up at once: a
// catch-up of every table (not a resync of some) with extra readers and
// more than one table to do.
func (c *CatchUp) tablesAtOnce(plan runPlan, tables []tidemark.TableID) bool {
	if len(c.readers) == 0 || len(plan.only) > 0 || c.pool != nil {
		return false
	}
	n := 0
	for _, id := range tables {
		if !plan.skip[id] {
			n++
		}
	}
	return n > 1
}

// runTables is run's loop over the tables with one worker per reader
// (see above). rep.Tables keeps the tables' order.
func (c *CatchUp) runTables(ctx context.Context, snap tidemark.Snapshot, tables []tidemark.TableID, initial bool, bound tidemark.SnapshotBoundary, enclosed bool, plan runPlan, rep *Report) error {
	srcs := append([]tidemark.SnapshotSource{c.src}, c.readers...)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.cfg.Logger.Info("catch-up reads tables at once", "source", c.cfg.Source, "workers", len(srcs))
	p := &workPool{workers: len(srcs), srcs: srcs}
	p.cond = sync.NewCond(&p.mu)
	// Unblock the workers waiting for work when the run is cancelled.
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	// planMu serializes what the workers share: the skip set and the
	// quarantine that adds to it, the report, the progress callback.
	var planMu sync.Mutex
	cfg := c.cfg
	if progress := c.cfg.Progress; progress != nil {
		cfg.Progress = func(pr Progress) {
			planMu.Lock()
			defer planMu.Unlock()
			progress(pr)
		}
	}
	order := map[tidemark.TableID]int{}
	for i, id := range tables {
		order[id] = i
	}
	first := len(rep.Tables)
	var fatal error
	next := 0
	// nextTable returns the next table to catch up, false when none is
	// left (under p.mu).
	nextTable := func() (tidemark.TableID, bool) {
		planMu.Lock()
		defer planMu.Unlock()
		for next < len(tables) {
			id := tables[next]
			next++
			if !plan.skip[id] {
				return id, true
			}
		}
		return tidemark.TableID{}, false
	}
	var wg sync.WaitGroup
	for _, src := range srcs {
		w := *c
		w.cfg, w.src, w.readers, w.pool = cfg, src, nil, p
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.work(ctx, src, nextTable, func(id tidemark.TableID) {
				tr, err := w.table(ctx, snap, id, initial, bound, enclosed, rep.firstRun)
				planMu.Lock()
				defer planMu.Unlock()
				if err = c.tableDone(ctx, id, tr, err, plan, rep); err != nil {
					if fatal == nil && !errors.Is(err, context.Canceled) {
						fatal = err
					}
					cancel()
				}
			})
		}()
	}
	wg.Wait()
	slices.SortStableFunc(rep.Tables[first:], func(a, b TableReport) int { return order[a.Table] - order[b.Table] })
	if fatal != nil {
		return fatal
	}
	return ctx.Err()
}

// workPool hands the tables of a run and the key ranges of its tables in
// progress to the workers.
type workPool struct {
	workers int
	srcs    []tidemark.SnapshotSource // every worker's reader

	mu      sync.Mutex
	cond    *sync.Cond
	offered []*rangeJob // ranges offered by tables in progress, oldest first
	tables  int         // tables in progress: they may still offer ranges
}

// rangeJob is one key range a worker offered.
type rangeJob struct {
	read  func(src tidemark.SnapshotSource)
	taken bool
	done  chan struct{}
}

// work runs one worker on its reader src: offered ranges first, then the
// next table (nextTable), until no table is left and none in progress can
// offer a range, or ctx is done.
func (p *workPool) work(ctx context.Context, src tidemark.SnapshotSource, nextTable func() (tidemark.TableID, bool), table func(tidemark.TableID)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ctx.Err() == nil {
		if j := p.take(); j != nil {
			p.mu.Unlock()
			j.read(src)
			close(j.done)
			p.mu.Lock()
			continue
		}
		if id, ok := nextTable(); ok {
			p.tables++
			p.mu.Unlock()
			table(id)
			p.mu.Lock()
			p.tables--
			p.cond.Broadcast()
			continue
		}
		if p.tables == 0 {
			return
		}
		p.cond.Wait()
	}
}

// take returns the oldest range nobody took yet, nil if none (under p.mu).
func (p *workPool) take() *rangeJob {
	for len(p.offered) > 0 {
		j := p.offered[0]
		p.offered = p.offered[1:]
		if !j.taken {
			j.taken = true
			return j
		}
	}
	return nil
}

// share reads n ranges of a worker's table with read(i, src): range 0 on
// the worker's own reader (own), the others offered to the free workers;
// those still untaken when range 0 is done are read on own too. It returns
// when every range is done.
func (p *workPool) share(ctx context.Context, own tidemark.SnapshotSource, n int, read func(i int, src tidemark.SnapshotSource)) {
	jobs := make([]*rangeJob, n-1)
	p.mu.Lock()
	for k := range jobs {
		i := k + 1
		jobs[k] = &rangeJob{read: func(src tidemark.SnapshotSource) { read(i, src) }, done: make(chan struct{})}
		p.offered = append(p.offered, jobs[k])
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	read(0, own)
	for _, j := range jobs {
		p.mu.Lock()
		mine := !j.taken
		j.taken = true
		p.mu.Unlock()
		if mine {
			j.read(own)
			close(j.done)
		}
	}
	for _, j := range jobs {
		<-j.done
	}
}
