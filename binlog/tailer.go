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
	"sync/atomic"
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
	// jsonSeen remembers, per table, whether each column name was declared
	// JSON when information_schema last listed it (MariaDB): a layout whose
	// first table map the stream reaches after the source renamed or
	// dropped one of its columns names a column information_schema no
	// longer has (see jsonColumns).
	jsonSeen map[tidemark.TableID]map[string]bool

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
	// writerCheck is the pipeline's check that this process is still the
	// source's only writer (SetWriterCheck); nil without one.
	writerCheck atomic.Pointer[func(context.Context) error]
}

var (
	_ tidemark.Source          = (*Tailer)(nil)
	_ tidemark.WriterCheckable = (*Tailer)(nil)
)

// SetWriterCheck implements tidemark.WriterCheckable: when the source ends
// the stream because another client registered with the tailer's ServerID,
// the stream reconnects (taking the id back) only after check returned
// nil, for at most Config.ServerIDTakenFor; without a check it stops with
// tidemark.ErrServerIDInUse.
func (t *Tailer) SetWriterCheck(check func(ctx context.Context) error) {
	t.writerCheck.Store(&check)
}

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
		jsonSeen: map[tidemark.TableID]map[string]bool{},
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
	var taken idTaken
	for {
		progressed, err := t.streamOnce(ctx, &pos, out)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		if errors.Is(err, tidemark.ErrServerIDInUse) {
			if err := t.takeIDBack(ctx, &taken, err); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(t.cfg.Backoff.Delay(taken.n)):
			}
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

// idTaken is a run of streams the source ended for another client with
// the tailer's server id, each less than ServerIDTakenFor after the last.
type idTaken struct {
	first, last time.Time
	n           int
}

// takeIDBack decides what follows a stream the source ended because
// another client registered with the tailer's server id (err wraps
// tidemark.ErrServerIDInUse). That client is the newer one: a standby that
// took the source's lock over, another replica configured with the same
// id, or a process that streams without the lock. Reconnecting would end
// its stream in turn, so the tailer does so (nil) only when the pipeline's
// writer check proves that this process holds the source's lock, and for
// at most ServerIDTakenFor; otherwise it returns the error to stop with:
// the check's (another process holds the lock: ErrSourceLockLost), or one
// naming the id.
func (t *Tailer) takeIDBack(ctx context.Context, taken *idTaken, err error) error {
	check := t.writerCheck.Load()
	if check == nil {
		return fmt.Errorf("%w; nothing proves that this process is the source's only writer (it holds no source lock), so it does not take server_id %d back: give every replica of the source its own server_id", err, t.cfg.ServerID)
	}
	now := time.Now()
	if taken.n == 0 || now.Sub(taken.last) > t.cfg.ServerIDTakenFor {
		*taken = idTaken{first: now}
	}
	taken.last = now
	taken.n++
	for attempt := 1; ; attempt++ {
		if time.Since(taken.first) > t.cfg.ServerIDTakenFor {
			return fmt.Errorf("%w; another client took server_id %d again and again for %s although this process holds the source lock: give every replica of the source its own server_id", err, t.cfg.ServerID, t.cfg.ServerIDTakenFor)
		}
		cerr := (*check)(ctx)
		if cerr == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(cerr, tidemark.ErrSourceLockLost) {
			return fmt.Errorf("stream binlog of %s: another client took server_id %d: %w", t.cfg.Name, t.cfg.ServerID, cerr)
		}
		// The lock could not be checked: nothing is proven, so the id
		// is not taken back yet.
		t.rl.Warn("another client took the stream's server_id and the source lock cannot be checked; checking again", "source", t.cfg.Name, "server_id", t.cfg.ServerID, "err", cerr)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(t.cfg.Backoff.Delay(attempt)):
		}
	}
	if taken.n == 1 {
		t.cfg.Logger.Warn("another client registered with this tailer's replica server_id and the source ended the stream; this process still holds the source lock, so it reconnects, taking the id back", "source", t.cfg.Name, "server_id", t.cfg.ServerID, "for", t.cfg.ServerIDTakenFor, "err", err)
	}
	return nil
}

// query runs a metadata statement on the tailer's SQL session.
func (t *Tailer) query(ctx context.Context, q string, args ...any) (*mysql.Result, error) {
	return t.sql.exec(ctx, q, args...)
}

var jsonCheckRE = regexp.MustCompile("(?i)^\\s*json_valid\\(`((?:[^`]|``)+)`\\)\\s*$")

// jsonColumns returns the columns of a MariaDB table declared JSON
// (readJSONColumns), cached per table until its next table map. MySQL has a
// real JSON type.
//
// information_schema describes the table as it is now, which may be a later
// layout than the table map the stream decodes: after the source ran
// RENAME COLUMN j TO k (or dropped j), the older layout's rows still name j,
// which information_schema no longer lists. Such a name is JSON if it was
// declared JSON when this process last saw it listed (jsonSeen); without
// that memory (a process started after the rename, at a checkpoint before
// it) the column is announced as text marked JSONUnknown (jsonKnown), which
// the sink resolves from what it knows of the column.
func (t *Tailer) jsonColumns(ctx context.Context, id tidemark.TableID) (map[string]bool, error) {
	if t.cfg.Flavor != FlavorMariaDB {
		return nil, nil
	}
	if m, ok := t.jsonCols[id]; ok {
		return m, nil
	}
	var m, listed map[string]bool
	err := tidemark.Retry(ctx, "read JSON columns of "+id.String(), queryRetry, isTransient, t.rl, func(ctx context.Context) error {
		var err error
		t.stats.SchemaReads.Add(1)
		if m, err = readJSONColumns(ctx, t.query, id); err != nil {
			return err
		}
		listed, err = readColumnNames(ctx, t.query, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	seen := t.jsonSeen[id]
	if seen == nil {
		seen = map[string]bool{}
		t.jsonSeen[id] = seen
	}
	for name := range listed {
		seen[name] = m[name]
	}
	for name, json := range seen {
		if json && !listed[name] {
			m[name] = true
		}
	}
	t.jsonCols[id] = m
	return m, nil
}

// jsonKnown returns the column names of a table whose JSON-ness the
// tailer knows (jsonSeen: listed in information_schema by this process's
// reads of it), nil when every column's is known (MySQL's table map has a
// real JSON type). A LONGTEXT column of a layout not among them is
// announced as text marked JSONUnknown (buildTable): a process started
// after the source renamed or dropped a JSON column, at a checkpoint
// before that, cannot tell (nemesis seed 574095280397); the sink resolves
// it from what it knows.
func (t *Tailer) jsonKnown(id tidemark.TableID) map[string]bool {
	if t.cfg.Flavor != FlavorMariaDB {
		return nil
	}
	if m := t.jsonSeen[id]; m != nil {
		return m
	}
	return map[string]bool{}
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
	ti, err := t.buildTable(tm, jc, t.jsonKnown(id), uniqueColumns(idx))
	if err == nil && ti.table != nil {
		ti.table.Indexes, ti.table.IndexesKnown = idx, true
		var unknown []string
		for _, c := range ti.table.Columns {
			if c.JSONUnknown {
				unknown = append(unknown, c.Name)
			}
		}
		if len(unknown) > 0 {
			t.cfg.Logger.Info("a layout of the table names LONGTEXT columns information_schema no longer lists, which may have been JSON: announced as text marked JSON-unknown, for the sink to resolve", "source", t.cfg.Name, "table", id.String(), "columns", strings.Join(unknown, ","))
		}
	}
	if err != nil {
		if errors.Is(err, tidemark.ErrSourceConfig) {
			return nil, err // the server's settings: every table is affected
		}
		// This table only: its rows are skipped and it is reported
		// (DDLUndecodable) so that the pipeline quarantines it; the
		// pipeline's quarantine is the one error line (a table already
		// quarantined, by a catch-up say, is not logged again).
		t.cfg.Logger.Warn("cannot decode the rows of a table; reporting it to be quarantined", "source", t.cfg.Name, "table", id.String(), "err", err)
		ti = &tableInfo{skip: true, err: err, id: id}
	}
	t.tables.put(id, key, ti)
	return ti, nil
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
	if errors.As(err, &me) && sameServerID(me) {
		return fmt.Errorf("stream binlog of %s from %s: the source ended the stream because another client registered with server_id %d: %s: %w", t.cfg.Name, pos, t.cfg.ServerID, me.Message, tidemark.ErrServerIDInUse)
	}
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

// erSlaveSameID is MariaDB's ER_SLAVE_SAME_ID, sent to the older of two
// binlog dumps with one server_id when the newer one registers ("A slave
// with the same server_uuid/server_id is already connected").
const erSlaveSameID = 4052

// sameServerID says whether a server error ended the stream for another
// client with the same replica server id: MariaDB's ER_SLAVE_SAME_ID, or
// MySQL's ER_MASTER_FATAL_ERROR_READING_BINLOG "A replica with the same
// server_uuid/server_id as this replica has connected to the source".
func sameServerID(me *mysql.MyError) bool {
	return me.Code == erSlaveSameID ||
		me.Code == mysql.ER_MASTER_FATAL_ERROR_READING_BINLOG && strings.Contains(me.Message, "same server_uuid/server_id")
}

// isTransient says which errors a reconnect may cure: network errors,
// timeouts, EOF, a server going away or shutting down. Typed tidemark
// errors and other server errors are not.
func isTransient(err error) bool {
	if err == nil {
		return false
	}
	for _, fatal := range []error{tidemark.ErrServerIDInUse, tidemark.ErrPositionPurged, tidemark.ErrPositionAhead, tidemark.ErrSourceChanged, tidemark.ErrSourceConfig, tidemark.ErrZeroDate, tidemark.ErrAmbiguousTime, tidemark.ErrNonexistentTime, tidemark.ErrInvalidIdentifier} {
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
