package binlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// Tailer streams one source's binlog as tidemark chunks.
type Tailer struct {
	cfg   Config
	stats Stats
	rl    *tidemark.RateLimitedLogger

	// tables caches decoded table maps by table and layout.
	tables *layoutCache
	// jsonCols caches, per table, the columns declared JSON (MariaDB).
	jsonCols map[tidemark.TableID]map[string]bool

	// sql is the metadata session: one connection, TIMESTAMP values read
	// in UTC.
	sql *sqlConns

	// lin is the epoch and identity positions are made in (shared with a
	// Reader made by NewReaderFor).
	lin *lineage
	// epoch is the epoch of the versions being made (streaming goroutine
	// only), seqErr the first version that did not fit.
	epoch  uint32
	seqErr error
	// mysqlGTIDMode is the MySQL source's gtid_mode=ON (checkMySQL).
	mysqlGTIDMode bool
	// charsets maps collation ids to character set names
	// (information_schema.COLLATIONS, read once: charsetOf).
	charsets map[uint64]string
	// floor is the source's epoch floor (SetEpochFloor).
	floor epochFloor
}

var _ tidemark.Source = (*Tailer)(nil)

// New validates cfg and returns a Tailer. It does not connect.
func New(cfg Config) (*Tailer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tailer{
		cfg:      cfg,
		rl:       &tidemark.RateLimitedLogger{Logger: cfg.Logger, Interval: 10 * time.Second},
		tables:   newLayoutCache(maxCachedTables),
		jsonCols: map[tidemark.TableID]map[string]bool{},
		lin:      &lineage{},
	}
	// TIMESTAMP values read over SQL are always read in UTC.
	t.sql = &sqlConns{cfg: &t.cfg, setup: []string{"SET time_zone = '+00:00'"}, purpose: "metadata session", shared: true}
	return t, nil
}

// Stats returns the tailer's counters.
func (t *Tailer) Stats() *Stats { return &t.stats }

// Close closes the tailer's metadata connection.
func (t *Tailer) Close() error { return t.sql.close() }

// Stream implements tidemark.Source. It checks the server's binlog settings,
// then streams from just after from (the oldest retained binlog when from is
// zero), reconnecting with capped backoff on transient errors. After a
// reconnect it resumes at the last transaction boundary it emitted, so a
// partly sent transaction is sent again from its start (the sink is
// idempotent).
func (t *Tailer) Stream(ctx context.Context, from tidemark.Position, out chan<- tidemark.Chunk) error {
	defer t.Close()
	err := tidemark.Retry(ctx, "check source settings", t.cfg.Backoff, isTransient, t.rl, t.checkServer)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	pos := from
	failures := 0
	for {
		progressed, err := t.streamOnce(ctx, &pos, out)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		if !isTransient(err) {
			return err
		}
		if progressed {
			failures = 0
		}
		failures++
		if t.cfg.Backoff.Attempts > 0 && failures >= t.cfg.Backoff.Attempts {
			return fmt.Errorf("stream binlog of %s from %s: giving up after %d attempts: %w", t.cfg.Name, pos, failures, err)
		}
		t.stats.Reconnects.Add(1)
		d := t.cfg.Backoff.Delay(failures)
		t.rl.Warn("binlog stream interrupted; reconnecting", "source", t.cfg.Name, "position", pos.String(), "attempt", failures, "delay", d, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
}

// query runs a metadata statement on the tailer's SQL session.
func (t *Tailer) query(ctx context.Context, q string, args ...any) (*mysql.Result, error) {
	return t.sql.exec(ctx, q, args...)
}

var jsonCheckRE = regexp.MustCompile("(?i)^\\s*json_valid\\(`((?:[^`]|``)+)`\\)\\s*$")

// jsonColumns returns the columns of a MariaDB table declared JSON
// (readJSONColumns), cached per table until its next table map. MySQL has a
// real JSON type.
func (t *Tailer) jsonColumns(ctx context.Context, id tidemark.TableID) (map[string]bool, error) {
	if t.cfg.Flavor != FlavorMariaDB {
		return nil, nil
	}
	if m, ok := t.jsonCols[id]; ok {
		return m, nil
	}
	var m map[string]bool
	err := tidemark.Retry(ctx, "read JSON columns of "+id.String(), queryRetry, isTransient, t.rl, func(ctx context.Context) error {
		var err error
		t.stats.SchemaReads.Add(1)
		m, err = readJSONColumns(ctx, t.query, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.jsonCols[id] = m
	return m, nil
}

// dropLayouts forgets the decoded layouts of a table.
func (t *Tailer) dropLayouts(id tidemark.TableID) { t.tables.drop(id) }

// tableFor returns the decoded info of a table-map event.
func (t *Tailer) tableFor(ctx context.Context, tm *replication.TableMapEvent) (*tableInfo, error) {
	key := tableMapKey(tm)
	id := tidemark.TableID{Database: string(tm.Schema), Name: string(tm.Table)}
	if ti, ok := t.tables.get(id, key); ok {
		return ti, nil
	}
	var jc map[string]bool
	var idx []tidemark.Index
	if t.cfg.included(id.Database, id.Name) {
		// A new layout of a table: re-read its JSON columns and its
		// secondary indexes (for a sink that mirrors them, and for the
		// unique columns' DST gap check, convDateTime).
		delete(t.jsonCols, id)
		var err error
		if jc, err = t.jsonColumns(ctx, id); err != nil {
			return nil, err
		}
		if err := t.loadCharsets(ctx); err != nil {
			return nil, err
		}
		if idx, err = t.readIndexes(ctx, id); err != nil {
			return nil, err
		}
	}
	ti, err := t.buildTable(tm, jc, uniqueColumns(idx))
	if err == nil && ti.table != nil {
		ti.table.Indexes, ti.table.IndexesKnown = idx, true
	}
	if err != nil {
		if errors.Is(err, tidemark.ErrSourceConfig) {
			return nil, err // the server's settings: every table is affected
		}
		// This table only: its rows are skipped and it is reported
		// (DDLUndecodable) so that the pipeline quarantines it.
		t.cfg.Logger.Error("cannot decode the rows of a table; it will be quarantined", "source", t.cfg.Name, "table", id.String(), "err", err)
		ti = &tableInfo{skip: true, err: err, id: id}
	}
	t.tables.put(id, key, ti)
	return ti, nil
}

// txState is the transaction being read.
type txState struct {
	active     bool
	standalone bool // MariaDB standalone group (DDL): ends after its query
	gtid       tidemark.MariaDBGTID
	hasGTID    bool
	seq        uint64
	index      uint32
	commitTime time.Time
	changes    []tidemark.Change
	ddl        []tidemark.DDLEvent // sent with the transaction's next chunk
	bytes      int
	sent       bool // part of it was already sent in a chunk
	// mysqlGTIDs are the MySQL GTIDs the transaction consumes (its own,
	// and at XA COMMIT its XA PREPARE's).
	mysqlGTIDs []string
	// xa is the XID of a MySQL XA transaction being read (XA START … XA
	// PREPARE): its rows are held, never sent before its XA COMMIT.
	xa string
}

// streamOnce opens one replication connection and streams until an error.
// pos is advanced at every emitted transaction boundary. progressed reports
// whether at least one transaction was emitted.
func (t *Tailer) streamOnce(ctx context.Context, pos *tidemark.Position, out chan<- tidemark.Chunk) (progressed bool, err error) {
	watch := newReadWatch(t.cfg.ReadTimeout)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watch.run(wctx)              // owned: ends when streamOnce returns
	rows := &rowFilter{cfg: &t.cfg} // used by go-mysql's decode goroutine only
	sc, err := syncerConfig(&t.cfg, t.cfg.ServerID)
	if err != nil {
		return false, err
	}
	// ParseTime: temporal values as time.Time, not formatted text.
	// go-mysql builds a DATETIME with time.Date, which silently turns an
	// invalid date stored under ALLOW_INVALID_DATES ('2026-02-30') into
	// another ('2026-03-02'): decodeRows (datecheck.go) finds those in the
	// raw row and hands them on as text, which convDateTime rejects naming
	// the column.
	sc.ParseTime = true
	// MySQL's binary JSON as MySQL's own JSON text: exact big integers and
	// decimals, doubles and temporal values as MySQL prints them
	// (mysql.go). MariaDB's JSON is text already.
	sc.RenderJSONAsMySQLText = true
	sc.RowsEventDecodeFunc = func(e *replication.RowsEvent, data []byte) error { return decodeRows(e, data, rows.skip) }
	sc.HeartbeatPeriod = t.cfg.Heartbeat
	// No ReadTimeout: go-mysql would set a read deadline on every packet
	// (a tenth of the decoder's time on small transactions). readWatch
	// enforces it instead (watch.go).
	sc.Dialer = watch.dial
	// go-mysql decodes ahead into this many events; its default (10240)
	// holds hundreds of MB of decoded rows and makes every GC cycle scan
	// them. 256 keeps the decoder busy and memory bounded.
	sc.EventCacheCount = 256
	sc.Logger = goMySQLLogger(t.cfg.Logger)
	syncer := replication.NewBinlogSyncer(sc)
	defer syncer.Close()

	// Who is the server now? Compared with the position's identity on
	// every connect: a reconnect may reach another server (a failover
	// behind the same address).
	st, err := t.readServer(ctx)
	if err != nil {
		return false, err
	}
	if err := t.checkDomains(st); err != nil {
		return false, err
	}
	if err := t.inspect(ctx, *pos, &st); err != nil {
		return false, err
	}
	res, err := t.resolve(*pos, st)
	if err != nil {
		return false, err
	}
	if len(res.Changed) > 0 || res.Note != "" {
		t.cfg.Logger.Warn("source identity: "+orNone(strings.Join(res.Changed, ", ")), "source", t.cfg.Name,
			"checkpoint", pos.String(), "resume", res.Start.String(), "note", res.Note)
	}
	*pos = res.Start
	t.epoch, t.seqErr = pos.Epoch, nil
	ident := pos.Source

	var gset tidemark.MariaDBGTIDSet
	var streamer *replication.BinlogStreamer
	var ms *mysqlStream // MySQL flavor only
	file := pos.File
	switch {
	case t.cfg.Flavor == FlavorMySQL:
		t.mysqlGTIDMode = strings.EqualFold(st.gtidMode, "ON") // this server's, after a failover too
		streamer, ms, file, err = t.startMySQL(ctx, syncer, *pos)
	case pos.GTID != "" && t.cfg.Flavor == FlavorMariaDB:
		if gset, err = tidemark.ParseMariaDBGTIDSet(pos.GTID); err != nil {
			return false, fmt.Errorf("start binlog of %s: %w", t.cfg.Name, err)
		}
		gs, perr := mysql.ParseMariadbGTIDSet(pos.GTID)
		if perr != nil {
			return false, fmt.Errorf("start binlog of %s at GTID %s: %w", t.cfg.Name, pos.GTID, perr)
		}
		streamer, err = syncer.StartSyncGTID(gs)
	case pos.File != "":
		if t.cfg.Flavor == FlavorMariaDB {
			// Recover the GTID position of the file/offset so that the
			// positions emitted carry a complete GTID set.
			r, qerr := t.query(ctx, "SELECT BINLOG_GTID_POS(?, ?)", pos.File, pos.Offset)
			if qerr != nil {
				return false, fmt.Errorf("read GTID position of %s: %w", pos, qerr)
			}
			s, _ := r.GetString(0, 0)
			if gset, err = tidemark.ParseMariaDBGTIDSet(s); err != nil {
				return false, fmt.Errorf("read GTID position of %s: %w", pos, err)
			}
		}
		streamer, err = syncer.StartSync(mysql.Position{Name: pos.File, Pos: uint32(pos.Offset)})
	case t.cfg.Flavor == FlavorMariaDB:
		gset = tidemark.MariaDBGTIDSet{}
		gs, _ := mysql.ParseMariadbGTIDSet("")
		streamer, err = syncer.StartSyncGTID(gs)
	default:
		r, qerr := t.query(ctx, "SHOW BINARY LOGS")
		if qerr != nil {
			return false, fmt.Errorf("list binary logs of %s: %w", t.cfg.Name, qerr)
		}
		first, _ := r.GetString(0, 0)
		file = first
		streamer, err = syncer.StartSync(mysql.Position{Name: first, Pos: 4})
	}
	if err != nil {
		return false, t.diverged(res, t.classify(watch.explain(replConnErr(&t.cfg, err)), *pos))
	}
	watch.started()

	var mx *mariaXA // MariaDB flavor only
	if t.cfg.Flavor == FlavorMariaDB {
		mx = &mariaXA{t: t, prepared: xaSet{}}
	}
	var tx txState
	send := func(ch tidemark.Chunk) error {
		if mx.holding() {
			return mx.hold(ch)
		}
		select {
		case out <- ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	flush := func() error {
		if len(tx.changes) == 0 && len(tx.ddl) == 0 {
			return nil
		}
		ch := tidemark.Chunk{Changes: tx.changes, DDL: tx.ddl}
		tx.changes, tx.ddl, tx.bytes, tx.sent = nil, nil, 0, true
		return send(ch)
	}
	commit := func(h *replication.EventHeader) error {
		if tx.hasGTID && gset != nil {
			gset[tx.gtid.Domain] = tx.gtid
		}
		np := tidemark.Position{File: file, Offset: uint64(h.LogPos), Epoch: t.epoch, Source: ident}
		if gset != nil {
			np.GTID = gset.String()
		}
		if ms != nil {
			if err := ms.add(tx.mysqlGTIDs...); err != nil {
				return err
			}
			np.GTID = ms.position()
		}
		ch := tidemark.Chunk{Changes: tx.changes, Commit: np, DDL: tx.ddl}
		t.stats.Transactions.Add(1)
		t.stats.Changes.Add(uint64(len(tx.changes)))
		tx = txState{}
		if err := send(ch); err != nil {
			return err
		}
		if mx.holding() {
			return nil // the position moves when the held chunks go out
		}
		*pos = np
		progressed = true
		return nil
	}

	var inner []*replication.BinlogEvent // events of a compressed transaction
	// release hands on what was held while an XA transaction was
	// prepared (mariaxa.go), and moves the position with it.
	release := func() error {
		p, err := mx.release(send)
		if err != nil {
			return err
		}
		if !p.IsZero() {
			*pos = p
			progressed = true
		}
		return nil
	}

	for {
		var ev *replication.BinlogEvent
		if len(inner) > 0 {
			ev, inner = inner[0], inner[1:]
		} else {
			watch.waiting.Store(true)
			ev, err = streamer.GetEvent(ctx)
			watch.waiting.Store(false)
			watch.events.Add(1)
			if err != nil {
				if ctx.Err() != nil {
					return progressed, nil
				}
				return progressed, t.diverged(res, t.classify(watch.explain(err), *pos))
			}
		}
		if t.seqErr != nil {
			return progressed, fmt.Errorf("stream binlog of %s at %s: %w", t.cfg.Name, file, t.seqErr)
		}
		h := ev.Header
		if ms != nil {
			done, err := ms.event(ev, &tx, commit)
			if err != nil {
				if ctx.Err() != nil {
					return progressed, nil
				}
				return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
			}
			if done {
				continue
			}
		}
		if mx != nil {
			done, err := mx.event(ev, &tx, commit, release)
			if err != nil {
				if ctx.Err() != nil {
					return progressed, nil
				}
				return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
			}
			if done {
				continue
			}
		}
		switch e := ev.Event.(type) {
		case *replication.TransactionPayloadEvent:
			inner = append(inner, e.Events...)
		case *replication.RotateEvent:
			file = string(e.NextLogName)
		case *replication.MariadbGTIDEvent:
			if t.cfg.Version == VersionGTID && gset != nil {
				for d := range gset {
					if d != e.GTID.DomainID {
						return progressed, fmt.Errorf("stream binlog of %s: GTID domains %d and %d both seen: version: gtid orders one domain's sequence numbers; set source.version: filepos: %w", t.cfg.Name, d, e.GTID.DomainID, tidemark.ErrSourceConfig)
					}
				}
			}
			tx = txState{active: !e.IsStandalone(), standalone: e.IsStandalone(), hasGTID: true,
				gtid:       tidemark.MariaDBGTID{Domain: e.GTID.DomainID, ServerID: e.GTID.ServerID, Seq: e.GTID.SequenceNumber},
				commitTime: time.Unix(int64(h.Timestamp), 0).UTC()}
			tx.seq = t.seqOf(e.GTID.SequenceNumber, file, h)
			if e.Flags&mariaFlPreparedXA != 0 {
				tx.xa = "(XA START)" // the XID arrives with XA END
			}
		case *replication.GTIDEvent:
			tx = txState{commitTime: time.Unix(int64(h.Timestamp), 0).UTC(), seq: t.seqOf(0, file, h)}
			if g, err := gtidOf(e); err != nil {
				return progressed, err
			} else if g != "" {
				tx.mysqlGTIDs = []string{g}
			}
		case *replication.QueryEvent:
			q := strings.TrimSpace(string(e.Query))
			switch {
			case strings.EqualFold(q, "BEGIN"):
				if !tx.hasGTID && tx.seq == 0 {
					tx.seq = t.seqOf(0, file, h)
				}
				tx.active = true
				if tx.commitTime.IsZero() {
					tx.commitTime = time.Unix(int64(h.Timestamp), 0).UTC()
				}
			case strings.EqualFold(q, "COMMIT") || strings.EqualFold(q, "ROLLBACK") || !tx.active:
				// (A ROLLBACK ends a group only when it changed
				// non-transactional tables, whose changes stay.)
				// COMMIT of a non-transactional group, or a standalone
				// statement (DDL) that is its own transaction.
				if err := t.addDDL(ctx, &tx, string(e.Schema), q, h); err != nil {
					if ctx.Err() != nil {
						return progressed, nil
					}
					return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
				}
				if err := commit(h); err != nil {
					if ctx.Err() != nil {
						return progressed, nil
					}
					return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
				}
			default:
				// A statement inside a transaction: CREATE TABLE …
				// SELECT logs its CREATE with the rows.
				if err := t.addDDL(ctx, &tx, string(e.Schema), q, h); err != nil {
					if ctx.Err() != nil {
						return progressed, nil
					}
					return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
				}
			}
		case *replication.XIDEvent:
			if err := commit(h); err != nil {
				if ctx.Err() != nil {
					return progressed, nil
				}
				return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
			}
		case *replication.RowsEvent:
			if err := t.addRows(ctx, &tx, e, h, flush); err != nil {
				if ctx.Err() != nil {
					return progressed, nil
				}
				return progressed, fmt.Errorf("stream binlog of %s at %s:%d: %w", t.cfg.Name, file, h.LogPos, err)
			}
		default:
			// An event tidemark does not act on may only pass between
			// transactions: inside one it could be part of the data.
			if (tx.active || len(tx.changes) > 0 || tx.sent) && !harmless(ev) {
				return progressed, fmt.Errorf("stream binlog of %s at %s:%d: event %s inside a transaction with pending rows: tidemark does not know it and will not skip it", t.cfg.Name, file, h.LogPos, eventName(ev))
			}
		}
	}
}

// addDDL records the schema changes of a statement of the current
// transaction (see ddl.go). The caches of a changed table are dropped. An
// ALTER TABLE (or CREATE/DROP INDEX) gets the table's secondary indexes as
// the source has them now.
func (t *Tailer) addDDL(ctx context.Context, tx *txState, db, query string, h *replication.EventHeader) error {
	if tx.seq == 0 && !tx.hasGTID {
		tx.seq = t.seqOf(0, "", h)
	}
	evs := parseDDL(db, query, tidemark.Version{Seq: tx.seq}, func(id tidemark.TableID) bool {
		return t.cfg.included(id.Database, id.Name)
	})
	for i := range evs {
		ev := &evs[i]
		delete(t.jsonCols, ev.Table)
		t.cfg.Logger.Info("schema change", "source", t.cfg.Name, "event", ev.String(), "version", ev.Version.String())
		// Decoded layouts of the table are read again (with its
		// indexes) at its next table map.
		t.dropLayouts(ev.Table)
		if ev.Op == tidemark.DDLAlterTable {
			idx, err := t.readIndexes(ctx, ev.Table)
			if err != nil {
				return err
			}
			ev.Indexes, ev.IndexesRead = idx, true
		}
	}
	tx.ddl = append(tx.ddl, evs...)
	return nil
}

// seqOf returns the Version.Seq of a transaction starting with header h:
// the current epoch (tidemark.EpochShift) over the GTID sequence number or
// fileIndex<<40 | offset. A value that does not fit is recorded in
// t.seqErr, which stops the stream before the next event.
func (t *Tailer) seqOf(gtidSeq uint64, file string, h *replication.EventHeader) uint64 {
	base := gtidSeq
	if t.cfg.Version != VersionGTID {
		idx, err := tidemark.BinlogFileIndex(file)
		if err != nil {
			idx = 0
		}
		start := uint64(h.LogPos) - uint64(h.EventSize)
		base = idx<<40 | start
	}
	seq, err := tidemark.EpochSeq(t.epoch, base)
	if err != nil && t.seqErr == nil {
		t.seqErr = err
	}
	return seq
}

// addRows converts a rows event into changes appended to tx, calling flush
// whenever the pending changes reach a chunk limit.
func (t *Tailer) addRows(ctx context.Context, tx *txState, e *replication.RowsEvent, h *replication.EventHeader, flush func() error) error {
	ti, err := t.tableFor(ctx, e.Table)
	if err != nil {
		return err
	}
	if ti.err != nil && !ti.reported {
		ti.reported = true
		tx.ddl = append(tx.ddl, tidemark.DDLEvent{Op: tidemark.DDLUndecodable, Table: ti.id, Version: tidemark.Version{Seq: tx.seq}, Reason: ti.err.Error()})
	}
	if ti.skip {
		return nil
	}
	if why := partialImage(e, h); why != "" {
		// Applied, a partial image would write NULLs (or stale values)
		// where the source has others: the table stops here, loudly.
		err := fmt.Errorf("decode rows event of %s: %s; tidemark needs whole row images: set it globally and for every session that writes, then resync the table", ti.table.ID, why)
		t.cfg.Logger.Error("partial row image; the table will be quarantined", "source", t.cfg.Name, "table", ti.table.ID.String(), "err", err)
		ti.err, ti.skip, ti.reported = err, true, true
		tx.ddl = append(tx.ddl, tidemark.DDLEvent{Op: tidemark.DDLUndecodable, Table: ti.table.ID, Version: tidemark.Version{Seq: tx.seq}, Reason: err.Error()})
		return nil
	}
	if tx.seq == 0 && !tx.hasGTID {
		tx.seq = t.seqOf(0, "", h)
	}
	if tx.commitTime.IsZero() {
		tx.commitTime = time.Unix(int64(h.Timestamp), 0).UTC()
	}
	convert := func(raw []any) ([]any, int, error) {
		if ti.keep != nil {
			// Excluded columns are dropped before conversion: their
			// values go no further than go-mysql's decoded event.
			if len(raw) < len(ti.keep) || len(raw) <= ti.keep[len(ti.keep)-1] {
				return nil, 0, fmt.Errorf("decode row of %s: %d values for a table with excluded columns", ti.table.ID, len(raw))
			}
			kept := make([]any, len(ti.keep))
			for j, i := range ti.keep {
				kept[j] = raw[i]
			}
			raw = kept
		}
		if len(raw) != len(ti.conv) {
			return nil, 0, fmt.Errorf("decode row of %s: %d values for %d columns", ti.table.ID, len(raw), len(ti.conv))
		}
		// Converted in place: the decoded row is the tailer's (go-mysql
		// hands each event over once), so it need not be copied.
		row := raw
		size := 0
		for i, v := range raw {
			nv, err := ti.conv[i](v)
			if err != nil {
				return nil, 0, err
			}
			row[i] = nv
			size += valueSize(nv)
		}
		return row, size, nil
	}
	add := func(op tidemark.Op, before, after []any, size int) error {
		if tx.xa != "" {
			if tx.bytes > t.maxXABytes() {
				return fmt.Errorf("XA transaction %s holds more than %d bytes of rows: tidemark keeps a prepared XA transaction in memory until its XA COMMIT; raise max_chunk_bytes", tx.xa, t.maxXABytes())
			}
		} else if tx.bytes >= t.cfg.MaxChunkBytes || len(tx.changes) >= t.cfg.MaxChunkChanges {
			if err := flush(); err != nil {
				return err
			}
		}
		tx.index++
		tx.changes = append(tx.changes, tidemark.Change{
			Op: op, Table: ti.table, Before: before, After: after,
			Version:    tidemark.Version{Seq: tx.seq, Index: tx.index},
			CommitTime: tx.commitTime, Size: size + 96,
		})
		tx.bytes += size + 96
		return nil
	}
	if need := len(tx.changes) + len(e.Rows); need > cap(tx.changes) {
		c := min(max(need, 2*cap(tx.changes)), t.cfg.MaxChunkChanges+len(e.Rows))
		grown := make([]tidemark.Change, len(tx.changes), c)
		copy(grown, tx.changes)
		tx.changes = grown
	}
	// A value that cannot be converted (an invalid date, a DST policy of
	// "error", zero_dates: error, text that is not UTF-8…) is this table's
	// problem only: the table is reported (DDLUndecodable, with the error
	// naming the column) so that the pipeline quarantines it, and its rows
	// are skipped from here on; the other tables go on.
	badValue := func(err error) error {
		var ve *tidemark.ValueError
		if !errors.As(err, &ve) {
			return err
		}
		t.cfg.Logger.Error("cannot convert a value; the table will be quarantined", "source", t.cfg.Name, "table", ti.table.ID.String(), "err", err)
		ti.err, ti.skip, ti.reported = err, true, true
		tx.ddl = append(tx.ddl, tidemark.DDLEvent{Op: tidemark.DDLUndecodable, Table: ti.table.ID, Version: tidemark.Version{Seq: tx.seq}, Reason: err.Error()})
		return nil
	}
	switch e.Type() {
	case replication.EnumRowsEventTypeInsert:
		for _, r := range e.Rows {
			row, n, err := convert(r)
			if err != nil {
				return badValue(err)
			}
			if err := add(tidemark.OpInsert, nil, row, n); err != nil {
				return err
			}
		}
	case replication.EnumRowsEventTypeDelete:
		for _, r := range e.Rows {
			row, n, err := convert(r)
			if err != nil {
				return badValue(err)
			}
			if err := add(tidemark.OpDelete, row, nil, n); err != nil {
				return err
			}
		}
	case replication.EnumRowsEventTypeUpdate:
		if len(e.Rows)%2 != 0 {
			return fmt.Errorf("decode update of %s: odd number of row images", ti.table.ID)
		}
		for i := 0; i < len(e.Rows); i += 2 {
			before, n1, err := convert(e.Rows[i])
			if err != nil {
				return badValue(err)
			}
			after, n2, err := convert(e.Rows[i+1])
			if err != nil {
				return badValue(err)
			}
			if err := add(tidemark.OpUpdate, before, after, n1+n2); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("decode rows event of %s: unknown event type", ti.table.ID)
	}
	return nil
}

// partialImage says why a rows event does not carry whole rows ("" when it
// does). binlog_row_image and binlog_row_value_options are session
// variables: the global FULL and ” that start checks (checkServer) do not
// keep one client from writing MINIMAL or NOBLOB images (an INSERT then
// logs only the columns it names, an UPDATE only the key before and the
// changed columns after) or JSON diffs (PARTIAL_UPDATE_ROWS_EVENT).
func partialImage(e *replication.RowsEvent, h *replication.EventHeader) string {
	if h != nil && h.EventType == replication.PARTIAL_UPDATE_ROWS_EVENT {
		return "a JSON partial update (PARTIAL_UPDATE_ROWS_EVENT, written by a session with binlog_row_value_options=PARTIAL_JSON); the fix is binlog_row_value_options=''"
	}
	var names [][]byte
	if e.Table != nil {
		names = e.Table.ColumnName
	}
	n := int(e.ColumnCount)
	var missing []string
	for _, bitmap := range [2][]byte{e.ColumnBitmap1, e.ColumnBitmap2} {
		if bitmap == nil {
			continue
		}
		for i := 0; i < n; i++ {
			if i>>3 < len(bitmap) && bitmap[i>>3]&(1<<(uint(i)&7)) != 0 {
				continue
			}
			name := "#" + strconv.Itoa(i+1)
			if i < len(names) {
				name = string(names[i])
			}
			if !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
		}
	}
	if e.Table != nil && n < len(e.Table.ColumnType) {
		missing = append(missing, fmt.Sprintf("%d of %d columns", len(e.Table.ColumnType)-n, len(e.Table.ColumnType)))
	}
	if len(missing) == 0 {
		return ""
	}
	return "the row image lacks column(s) " + strings.Join(missing, ", ") + " (written by a session with binlog_row_image=MINIMAL or NOBLOB); the fix is binlog_row_image=FULL"
}

// classify maps a replication error to tidemark's error classes:
// ErrPositionPurged (not retried), ErrPositionAhead (fatal), other fatal
// server errors, or a transient error (retried).
func (t *Tailer) classify(err error, pos tidemark.Position) error {
	var me *mysql.MyError
	if errors.As(err, &me) && me.Code == mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG {
		msg := me.Message
		switch {
		case strings.Contains(msg, "Could not find first log file name"),
			strings.Contains(msg, "Could not find GTID state requested by slave in any binlog files"),
			strings.Contains(msg, "required binlog files have been purged"),
			strings.Contains(msg, "purged"):
			return fmt.Errorf("stream binlog of %s from %s: %s: %w", t.cfg.Name, pos, msg, tidemark.ErrPositionPurged)
		case strings.Contains(msg, "which is not in the master's binlog"),
			strings.Contains(msg, "which is not in the primary's binlog"),
			strings.Contains(msg, "has not yet been"),
			strings.Contains(msg, "has more GTIDs than"),                         // MySQL: Replica/Slave has more GTIDs than the source/master has
			strings.Contains(msg, "start replication from position > file size"): // MySQL: offset beyond the file
			return fmt.Errorf("stream binlog of %s from %s: %s: %w", t.cfg.Name, pos, msg, tidemark.ErrPositionAhead)
		default:
			return fmt.Errorf("stream binlog of %s from %s: fatal source error: %s", t.cfg.Name, pos, msg)
		}
	}
	return fmt.Errorf("stream binlog of %s from %s: %w", t.cfg.Name, pos, redact(err, t.cfg.Password))
}

// isTransient says which errors a reconnect may cure: network errors,
// timeouts, EOF, a server going away or shutting down. Typed tidemark
// errors and other server errors are not.
func isTransient(err error) bool {
	if err == nil {
		return false
	}
	for _, fatal := range []error{tidemark.ErrPositionPurged, tidemark.ErrPositionAhead, tidemark.ErrSourceChanged, tidemark.ErrSourceConfig, tidemark.ErrZeroDate, tidemark.ErrAmbiguousTime, tidemark.ErrNonexistentTime, tidemark.ErrInvalidIdentifier} {
		if errors.Is(err, fatal) {
			return false
		}
	}
	var ve *tidemark.ValueError
	if errors.As(err, &ve) {
		return false
	}
	if tidemark.IsTLSVerifyError(err) || noServerTLS(err) {
		return false // a certificate that did not verify, a server without TLS: retrying would not change them
	}
	var me *mysql.MyError
	if errors.As(err, &me) {
		switch me.Code {
		case mysql.ER_CON_COUNT_ERROR, mysql.ER_SERVER_SHUTDOWN, mysql.ER_NET_READ_ERROR, mysql.ER_NET_READ_INTERRUPTED,
			mysql.ER_NET_ERROR_ON_WRITE, mysql.ER_NET_WRITE_INTERRUPTED, mysql.ER_QUERY_INTERRUPTED, 1927 /* ER_CONNECTION_KILLED */ :
			return true
		}
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"connection refused", "connection reset", "broken pipe", "i/o timeout", "EOF", "bad connection", "sync is been closing", "invalid sequence", "use of closed network connection"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// redact removes the password from an error's text.
func redact(err error, password string) error {
	if err == nil || password == "" || !strings.Contains(err.Error(), password) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), password, "***"))
}
