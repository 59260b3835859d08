package binlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// A session is one replication connection of a Tailer's stream: opened
// (open) against the server the address reaches now, started at the
// resolved position (startAt), then read event by event (next, handle)
// until an error. It emits each transaction at its boundary (commit) and
// moves the stream's position with it. Streaming goroutine only.
type session struct {
	t   *Tailer
	out chan<- tidemark.Chunk
	// watch is the connection's read timeout (watch.go).
	watch    *readWatch
	syncer   *replication.BinlogSyncer
	streamer *replication.BinlogStreamer
	// res is how the stored position was resolved against the server
	// (identity.go); a failure to start or to read is judged with it.
	res Resolution
	// pos is the last transaction boundary emitted (the Tailer's, moved in
	// place); progressed says whether this session moved it.
	pos        *tidemark.Position
	progressed bool
	// ident is the server identity every emitted position carries.
	ident tidemark.SourceIdentity
	// file is the binlog file being read.
	file string
	// gtids is the MariaDB GTID set of the emitted positions: nil for
	// MySQL, and for MariaDB without a GTID to start from.
	gtids tidemark.MariaDBGTIDSet
	// mysql is the MySQL flavor's GTID set and prepared XA transactions
	// (nil for MariaDB).
	mysql *mysqlStream
	// mariaXA is the MariaDB flavor's prepared XA transactions and the
	// chunks held behind them (nil for MySQL).
	mariaXA *mariaXA
	// tx is the transaction being read.
	tx txState
	// inner are the events of a compressed transaction not handled yet.
	inner []*replication.BinlogEvent
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
	s := &session{t: t, out: out, pos: pos, watch: newReadWatch(t.cfg.ReadTimeout)}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go s.watch.run(wctx) // owned: ends when streamOnce returns
	defer s.close()
	st, err := s.open(ctx)
	if err != nil {
		return false, err
	}
	if err := s.startAt(ctx, st); err != nil {
		return false, err
	}
	for {
		ev, err := s.next(ctx)
		if err == nil {
			err = s.handle(ctx, ev)
		}
		if err != nil {
			return s.progressed, s.fail(ctx, err)
		}
	}
}

// fail is how a session ends on err: a stream stopped by its context ends
// without an error (Stream returns nil then), any other error is the
// session's.
func (s *session) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// at names where in the binlog an event's handling failed (nil stays nil).
func (s *session) at(h *replication.EventHeader, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("stream binlog of %s at %s:%d: %w", s.t.cfg.Name, s.file, h.LogPos, err)
}

// close closes the replication connection.
func (s *session) close() {
	if s.syncer != nil {
		s.syncer.Close()
	}
}

// newSyncer makes the replication connection's syncer; watch enforces its
// read timeout.
func (t *Tailer) newSyncer(watch *readWatch) (*replication.BinlogSyncer, error) {
	rows := &rowFilter{cfg: &t.cfg} // used by go-mysql's decode goroutine only
	sc, err := syncerConfig(&t.cfg, t.cfg.ServerID)
	if err != nil {
		return nil, err
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
	return replication.NewBinlogSyncer(sc), nil
}

// open makes the syncer and resolves the stored position against the
// server the address reaches now: a reconnect may reach another server (a
// failover behind the same address), so its identity is compared with the
// position's on every connect. The position becomes the resolved start.
func (s *session) open(ctx context.Context) (serverState, error) {
	t := s.t
	syncer, err := t.newSyncer(s.watch)
	if err != nil {
		return serverState{}, err
	}
	s.syncer = syncer
	st, err := t.readServer(ctx)
	if err != nil {
		return serverState{}, err
	}
	if err := t.checkDomains(st); err != nil {
		return serverState{}, err
	}
	if err := t.inspect(ctx, *s.pos, &st); err != nil {
		return serverState{}, err
	}
	res, err := t.resolve(*s.pos, st)
	if err != nil {
		return serverState{}, err
	}
	s.res = res
	if len(res.Changed) > 0 || res.Note != "" {
		t.cfg.Logger.Warn("source identity: "+orNone(strings.Join(res.Changed, ", ")), "source", t.cfg.Name,
			"checkpoint", s.pos.String(), "resume", res.Start.String(), "note", res.Note)
	}
	*s.pos = res.Start
	t.epoch, t.seqErr = s.pos.Epoch, nil
	s.ident, s.file = s.pos.Source, s.pos.File
	return st, nil
}

// startAt starts the binlog dump at the session's position: MySQL as
// startMySQL says; MariaDB by GTID when the position has one, else by file
// and offset (the GTID set recovered for it), else from the oldest
// retained binlog. A failure to start is classified (classify, diverged).
func (s *session) startAt(ctx context.Context, st serverState) error {
	t, pos := s.t, *s.pos
	var err error
	switch {
	case t.cfg.Flavor == FlavorMySQL:
		t.mysqlGTIDMode = strings.EqualFold(st.gtidMode, "ON") // this server's, after a failover too
		s.streamer, s.mysql, s.file, err = t.startMySQL(ctx, s.syncer, pos)
	case pos.GTID != "" && t.cfg.Flavor == FlavorMariaDB && !(s.res.ByFile && pos.File != ""):
		if s.gtids, err = tidemark.ParseMariaDBGTIDSet(pos.GTID); err != nil {
			return fmt.Errorf("start binlog of %s: %w", t.cfg.Name, err)
		}
		gs, perr := mysql.ParseMariadbGTIDSet(pos.GTID)
		if perr != nil {
			return fmt.Errorf("start binlog of %s at GTID %s: %w", t.cfg.Name, pos.GTID, perr)
		}
		s.streamer, err = s.syncer.StartSyncGTID(gs)
	case pos.File != "":
		if t.cfg.Flavor == FlavorMariaDB {
			if s.gtids, err = t.gtidPosOf(ctx, pos); err != nil {
				return err
			}
		}
		s.streamer, err = s.syncer.StartSync(mysql.Position{Name: pos.File, Pos: uint32(pos.Offset)})
	case t.cfg.Flavor == FlavorMariaDB:
		s.gtids = tidemark.MariaDBGTIDSet{}
		gs, _ := mysql.ParseMariadbGTIDSet("")
		s.streamer, err = s.syncer.StartSyncGTID(gs)
	default:
		r, qerr := t.query(ctx, "SHOW BINARY LOGS")
		if qerr != nil {
			return fmt.Errorf("list binary logs of %s: %w", t.cfg.Name, qerr)
		}
		first, _ := r.GetString(0, 0)
		s.file = first
		s.streamer, err = s.syncer.StartSync(mysql.Position{Name: first, Pos: 4})
	}
	if err != nil {
		return t.diverged(s.res, t.classify(s.watch.explain(replConnErr(&t.cfg, err)), *s.pos))
	}
	s.watch.started()
	if t.cfg.Flavor == FlavorMariaDB {
		s.mariaXA = &mariaXA{t: t, prepared: xaSet{}}
	}
	return nil
}

// gtidPosOf recovers the MariaDB GTID position of a file/offset, so that
// the positions emitted carry a complete GTID set.
func (t *Tailer) gtidPosOf(ctx context.Context, pos tidemark.Position) (tidemark.MariaDBGTIDSet, error) {
	r, err := t.query(ctx, "SELECT BINLOG_GTID_POS(?, ?)", pos.File, pos.Offset)
	if err != nil {
		return nil, fmt.Errorf("read GTID position of %s: %w", pos, err)
	}
	str, _ := r.GetString(0, 0)
	set, err := tidemark.ParseMariaDBGTIDSet(str)
	if err != nil {
		return nil, fmt.Errorf("read GTID position of %s: %w", pos, err)
	}
	return set, nil
}

// next returns the next event: the next of a compressed transaction's
// events, else the next the server sends.
func (s *session) next(ctx context.Context) (*replication.BinlogEvent, error) {
	if len(s.inner) > 0 {
		ev := s.inner[0]
		s.inner = s.inner[1:]
		return ev, nil
	}
	s.watch.waiting.Store(true)
	ev, err := s.streamer.GetEvent(ctx)
	s.watch.waiting.Store(false)
	s.watch.events.Add(1)
	if err != nil {
		return nil, s.t.diverged(s.res, s.t.classify(s.watch.explain(err), *s.pos))
	}
	return ev, nil
}

// handle acts on one event: the flavor's XA and GTID events first
// (flavorEvent), then transaction boundaries, rows and statements. An event
// tidemark does not act on may only pass between transactions.
func (s *session) handle(ctx context.Context, ev *replication.BinlogEvent) error {
	t := s.t
	if t.seqErr != nil {
		return fmt.Errorf("stream binlog of %s at %s: %w", t.cfg.Name, s.file, t.seqErr)
	}
	h := ev.Header
	if done, err := s.flavorEvent(ctx, ev); err != nil || done {
		return s.at(h, err)
	}
	switch e := ev.Event.(type) {
	case *replication.TransactionPayloadEvent:
		s.inner = append(s.inner, e.Events...)
	case *replication.RotateEvent:
		s.file = string(e.NextLogName)
	case *replication.MariadbGTIDEvent:
		return s.beginGroup(e, h)
	case *replication.GTIDEvent:
		return s.beginTransaction(e, h)
	case *replication.QueryEvent:
		return s.at(h, s.query(ctx, e, h))
	case *replication.XIDEvent:
		return s.at(h, s.commit(ctx, h))
	case *replication.RowsEvent:
		return s.at(h, s.addRows(ctx, e, h))
	default:
		// Inside a transaction an unknown event could be part of the data.
		if (s.tx.active || len(s.tx.changes) > 0 || s.tx.sent) && !harmless(ev) {
			return s.at(h, fmt.Errorf("event %s inside a transaction with pending rows: tidemark does not know it and will not skip it", eventName(ev)))
		}
	}
	return nil
}

// flavorEvent hands an event to the flavor's state (mysqlStream.event,
// mariaXA.event); done reports that the event needs nothing more.
func (s *session) flavorEvent(ctx context.Context, ev *replication.BinlogEvent) (done bool, err error) {
	commit := func(h *replication.EventHeader) error { return s.commit(ctx, h) }
	if s.mysql != nil {
		if done, err := s.mysql.event(ev, &s.tx, commit); err != nil || done {
			return done, err
		}
	}
	if s.mariaXA != nil {
		return s.mariaXA.event(ev, &s.tx, commit, func() error { return s.release(ctx) })
	}
	return false, nil
}

// beginGroup starts a MariaDB event group. With version: gtid every group
// must be of the one domain the position's GTID set has.
func (s *session) beginGroup(e *replication.MariadbGTIDEvent, h *replication.EventHeader) error {
	t := s.t
	if t.cfg.Version == VersionGTID && s.gtids != nil {
		for d := range s.gtids {
			if d != e.GTID.DomainID {
				return fmt.Errorf("stream binlog of %s: GTID domains %d and %d both seen: version: gtid orders one domain's sequence numbers; set source.version: filepos: %w", t.cfg.Name, d, e.GTID.DomainID, tidemark.ErrSourceConfig)
			}
		}
		// Without gtid_strict_mode a sequence number can go backwards
		// (SET gtid_seq_no, a mysqlbinlog replay): the group's rows
		// would get versions below rows already written, and lose to
		// them in the target.
		if last, ok := s.gtids[e.GTID.DomainID]; ok && e.GTID.SequenceNumber <= last.Seq {
			return fmt.Errorf("stream binlog of %s at %s:%d: GTID %s follows %s: the domain's sequence number went backwards (gtid_strict_mode off: SET gtid_seq_no, a mysqlbinlog replay), and version: gtid, which orders changes by it, would let older rows win over this transaction's: set gtid_strict_mode=ON, and source.version: filepos (tidemark then resumes at the checkpoint in the next epoch, ordering by binlog position): %w",
				t.cfg.Name, s.file, uint64(h.LogPos)-uint64(h.EventSize), e.GTID.String(), last, tidemark.ErrSourceConfig)
		}
	}
	s.tx = txState{active: !e.IsStandalone(), standalone: e.IsStandalone(), hasGTID: true,
		gtid:       tidemark.MariaDBGTID{Domain: e.GTID.DomainID, ServerID: e.GTID.ServerID, Seq: e.GTID.SequenceNumber},
		commitTime: time.Unix(int64(h.Timestamp), 0).UTC()}
	s.tx.seq = t.seqOf(e.GTID.SequenceNumber, s.file, h)
	if e.Flags&mariaFlPreparedXA != 0 {
		s.tx.xa = "(XA START)" // the XID arrives with XA END
	}
	return nil
}

// beginTransaction starts a MySQL transaction at its GTID event.
func (s *session) beginTransaction(e *replication.GTIDEvent, h *replication.EventHeader) error {
	s.tx = txState{commitTime: time.Unix(int64(h.Timestamp), 0).UTC(), seq: s.t.seqOf(0, s.file, h)}
	g, err := gtidOf(e)
	if err != nil {
		return err
	}
	if g != "" {
		s.tx.mysqlGTIDs = []string{g}
	}
	return nil
}

// query handles a statement: BEGIN opens a transaction; COMMIT, ROLLBACK
// and a statement outside a transaction end one; any other statement
// inside a transaction is recorded with it (addDDL).
func (s *session) query(ctx context.Context, e *replication.QueryEvent, h *replication.EventHeader) error {
	t := s.t
	q := strings.TrimSpace(string(e.Query))
	switch {
	case strings.EqualFold(q, "BEGIN"):
		if !s.tx.hasGTID && s.tx.seq == 0 {
			s.tx.seq = t.seqOf(0, s.file, h)
		}
		s.tx.active = true
		if s.tx.commitTime.IsZero() {
			s.tx.commitTime = time.Unix(int64(h.Timestamp), 0).UTC()
		}
		return nil
	case strings.EqualFold(q, "COMMIT") || strings.EqualFold(q, "ROLLBACK") || !s.tx.active:
		// (A ROLLBACK ends a group only when it changed
		// non-transactional tables, whose changes stay.)
		// COMMIT of a non-transactional group, or a standalone
		// statement (DDL) that is its own transaction.
		if err := t.addDDL(ctx, &s.tx, string(e.Schema), q, h); err != nil {
			return err
		}
		return s.commit(ctx, h)
	default:
		// A statement inside a transaction: CREATE TABLE …
		// SELECT logs its CREATE with the rows.
		return t.addDDL(ctx, &s.tx, string(e.Schema), q, h)
	}
}

// send hands a chunk on, or holds it while a MariaDB XA transaction is
// prepared (mariaxa.go).
func (s *session) send(ctx context.Context, ch tidemark.Chunk) error {
	if s.mariaXA.holding() {
		return s.mariaXA.hold(ch)
	}
	select {
	case s.out <- ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flush sends the transaction's pending changes as a chunk without a
// commit position (a transaction larger than a chunk).
func (s *session) flush(ctx context.Context) error {
	if len(s.tx.changes) == 0 && len(s.tx.ddl) == 0 {
		return nil
	}
	ch := tidemark.Chunk{Changes: s.tx.changes, DDL: s.tx.ddl}
	s.tx.changes, s.tx.ddl, s.tx.bytes, s.tx.sent = nil, nil, 0, true
	return s.send(ctx, ch)
}

// commit ends the transaction at the event with header h: its GTID joins
// the set, and its last chunk carries the position after h. The
// session's position moves with it unless the chunk is held.
func (s *session) commit(ctx context.Context, h *replication.EventHeader) error {
	t := s.t
	if s.tx.hasGTID && s.gtids != nil {
		s.gtids[s.tx.gtid.Domain] = s.tx.gtid
	}
	np := tidemark.Position{File: s.file, Offset: uint64(h.LogPos), Epoch: t.epoch, Source: s.ident}
	if s.gtids != nil {
		np.GTID = s.gtids.String()
	}
	if s.mysql != nil {
		if err := s.mysql.add(s.tx.mysqlGTIDs...); err != nil {
			return err
		}
		np.GTID = s.mysql.position()
	}
	ch := tidemark.Chunk{Changes: s.tx.changes, Commit: np, DDL: s.tx.ddl}
	t.stats.Transactions.Add(1)
	t.stats.Changes.Add(uint64(len(s.tx.changes)))
	s.tx = txState{}
	if err := s.send(ctx, ch); err != nil {
		return err
	}
	if s.mariaXA.holding() {
		return nil // the position moves when the held chunks go out
	}
	*s.pos = np
	s.progressed = true
	return nil
}

// release hands on what was held while an XA transaction was prepared
// (mariaxa.go), and moves the position with it.
func (s *session) release(ctx context.Context) error {
	p, err := s.mariaXA.release(func(ch tidemark.Chunk) error { return s.send(ctx, ch) })
	if err != nil {
		return err
	}
	if !p.IsZero() {
		*s.pos = p
		s.progressed = true
	}
	return nil
}

// addRows converts a rows event into changes of the transaction, flushing
// whenever the pending changes reach a chunk limit.
func (s *session) addRows(ctx context.Context, e *replication.RowsEvent, h *replication.EventHeader) error {
	t, tx := s.t, &s.tx
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
		s.undecodable(ti, err)
		return nil
	}
	if tx.seq == 0 && !tx.hasGTID {
		tx.seq = t.seqOf(0, "", h)
	}
	if tx.commitTime.IsZero() {
		tx.commitTime = time.Unix(int64(h.Timestamp), 0).UTC()
	}
	if need := len(tx.changes) + len(e.Rows); need > cap(tx.changes) {
		c := min(max(need, 2*cap(tx.changes)), t.cfg.MaxChunkChanges+len(e.Rows))
		grown := make([]tidemark.Change, len(tx.changes), c)
		copy(grown, tx.changes)
		tx.changes = grown
	}
	return s.addImages(ctx, ti, e)
}

// addImages appends one change per row of an insert or a delete, one per
// before/after pair of an update.
func (s *session) addImages(ctx context.Context, ti *tableInfo, e *replication.RowsEvent) error {
	op, step := tidemark.OpInsert, 1
	switch e.Type() {
	case replication.EnumRowsEventTypeInsert:
	case replication.EnumRowsEventTypeDelete:
		op = tidemark.OpDelete
	case replication.EnumRowsEventTypeUpdate:
		if len(e.Rows)%2 != 0 {
			return fmt.Errorf("decode update of %s: odd number of row images", ti.table.ID)
		}
		op, step = tidemark.OpUpdate, 2
	default:
		return fmt.Errorf("decode rows event of %s: unknown event type", ti.table.ID)
	}
	for i := 0; i < len(e.Rows); i += step {
		var images [2][]any // before, after (an insert's one image is its after)
		size := 0
		for j, raw := range e.Rows[i : i+step] {
			row, n, err := ti.convert(raw)
			if err != nil {
				return s.badValue(ti, err)
			}
			images[j], size = row, size+n
		}
		if op == tidemark.OpInsert {
			images[0], images[1] = nil, images[0]
		}
		if err := s.addChange(ctx, ti, op, images[0], images[1], size); err != nil {
			return err
		}
	}
	return nil
}

// convert converts a decoded row image to the table's columns and returns
// its estimated size.
func (ti *tableInfo) convert(raw []any) ([]any, int, error) {
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

// addChange appends one change to the transaction, first flushing the
// pending ones when they reach a chunk limit; a prepared XA transaction's
// rows are never flushed, only bounded.
func (s *session) addChange(ctx context.Context, ti *tableInfo, op tidemark.Op, before, after []any, size int) error {
	t, tx := s.t, &s.tx
	if tx.xa != "" {
		if tx.bytes > t.maxXABytes() {
			return fmt.Errorf("XA transaction %s holds more than %d bytes of rows: tidemark keeps a prepared XA transaction in memory until its XA COMMIT; raise max_chunk_bytes", tx.xa, t.maxXABytes())
		}
	} else if tx.bytes >= t.cfg.MaxChunkBytes || len(tx.changes) >= t.cfg.MaxChunkChanges {
		if err := s.flush(ctx); err != nil {
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

// badValue handles a value that cannot be converted (an invalid date, a
// DST policy of "error", zero_dates: error, text that is not UTF-8…): it
// is this table's problem only. The table is reported (DDLUndecodable, with
// the error naming the column) so that the pipeline quarantines it, and
// its rows are skipped from here on; the other tables go on. Any other
// error is returned.
func (s *session) badValue(ti *tableInfo, err error) error {
	var ve *tidemark.ValueError
	if !errors.As(err, &ve) {
		return err
	}
	s.t.cfg.Logger.Error("cannot convert a value; the table will be quarantined", "source", s.t.cfg.Name, "table", ti.table.ID.String(), "err", err)
	s.undecodable(ti, err)
	return nil
}

// undecodable marks a table's rows undecodable from here on and reports it
// with the transaction (DDLUndecodable).
func (s *session) undecodable(ti *tableInfo, err error) {
	ti.err, ti.skip, ti.reported = err, true, true
	s.tx.ddl = append(s.tx.ddl, tidemark.DDLEvent{Op: tidemark.DDLUndecodable, Table: ti.table.ID, Version: tidemark.Version{Seq: s.tx.seq}, Reason: err.Error()})
}
