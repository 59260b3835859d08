package binlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// Reader reads source tables with bounded SQL queries: the fallback's
// catch-up windows, first-run snapshots and key listings. Values are
// normalized exactly like the Tailer's (same converters, same zone policy),
// so a row read here and the same row decoded from the binlog are equal.
//
// Every value reaches SQL as a bind parameter; identifiers come from
// information_schema, are validated with tidemark.CheckIdentifier and are
// quoted.
type Reader struct {
	t *Tailer // for the config, the metadata connection and JSON columns

	mu     sync.Mutex
	tables map[tidemark.TableID]*readTable

	gtidScans atomic.Uint64 // captures that needed BINLOG_GTID_POS
}

// readTable is a table as the reader sees it.
type readTable struct {
	table  *tidemark.Table
	conv   []converter
	bconv  []func([]byte) (any, error) // per column, or nil: conv of a value that arrives as bytes, without boxing them
	selSQL []string                    // per column select expression
	kinds  []tidemark.Kind
}

var _ tidemark.SnapshotSource = (*Reader)(nil)

// NewReader validates cfg and returns a Reader. It connects lazily.
func NewReader(cfg Config) (*Reader, error) {
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Reader{t: t, tables: map[tidemark.TableID]*readTable{}}, nil
}

// NewReaderFor returns a Reader with its own connection that stamps what it
// captures with the epoch and source identity t resolved (see
// Tailer.Resolve): a catch-up after a reset binlog or a changed server then
// writes versions that win over everything written before.
func NewReaderFor(t *Tailer) (*Reader, error) {
	r, err := NewReader(t.cfg)
	if err != nil {
		return nil, err
	}
	r.t.lin = t.lin
	return r, nil
}

// Close closes the reader's connection.
func (r *Reader) Close() error { return r.t.Close() }

// Stats returns the reader's counters (zero dates).
func (r *Reader) Stats() *Stats { return &r.t.stats }

// castChar selects a temporal column as its text. A read with a cursor is a
// prepared statement, whose binary rows carry temporal values as fields that
// go-mysql formats back to text with fmt (a fifth of the Go CPU of a
// snapshot); the server's own text is the same digits, made in C, and what a
// read without parameters (the text protocol) returns anyway.
func castChar(sel string) string { return "CAST(" + sel + " AS CHAR)" }

// exec runs a statement on the metadata connection, retrying transient
// errors. A table the statement names that does not exist (renamed or
// dropped since it was listed: ER_NO_SUCH_TABLE) is tidemark.ErrTableGone.
func (r *Reader) exec(ctx context.Context, q string, args ...any) (*mysql.Result, error) {
	var res *mysql.Result
	err := tidemark.Retry(ctx, "query source", queryRetry, isTransient, r.t.rl, func(ctx context.Context) error {
		var err error
		res, err = r.t.query(ctx, q, args...)
		return err
	})
	var me *mysql.MyError
	if errors.As(err, &me) && me.Code == mysql.ER_NO_SUCH_TABLE {
		err = fmt.Errorf("%w: %w", err, tidemark.ErrTableGone)
	}
	return res, err
}

// stream is exec for a SELECT whose rows are handed to row as they arrive
// (sqlConns.stream), retried as exec is.
func (r *Reader) stream(ctx context.Context, q string, args []any, fields func([]*mysql.Field) error, row func([]mysql.FieldValue) error) error {
	err := tidemark.Retry(ctx, "query source", queryRetry, isTransient, r.t.rl, func(ctx context.Context) error {
		return r.t.sql.stream(ctx, q, args, fields, row)
	})
	var me *mysql.MyError
	if errors.As(err, &me) && me.Code == mysql.ER_NO_SUCH_TABLE {
		err = fmt.Errorf("%w: %w", err, tidemark.ErrTableGone)
	}
	return err
}

// Capture implements tidemark.SnapshotSource: the binlog position (GTID
// state, file and offset) and the source clock, taken so that every
// transaction up to the position is visible to every read that follows.
//
// Reading SHOW MASTER STATUS or @@gtid_binlog_pos as plain statements does
// not keep that promise: under group commit a transaction is written to the
// binlog (and counted in @@gtid_binlog_pos) before the engine commits it, so
// a read right after the capture can miss rows the binlog then resumes past
// (TestCaptureSeesEverythingBeforeIt loses rows that way). MariaDB: START
// TRANSACTION WITH CONSISTENT SNAPSHOT reports, in
// Binlog_snapshot_file/position, the binlog position that matches its read
// view exactly; BINLOG_GTID_POS turns it into the GTID state. MySQL: FLUSH
// TABLES WITH READ LOCK waits for the commits in flight and holds new ones
// while the position is read (the RELOAD privilege is needed).
//
// The reads need not run inside that transaction: a read view opened later
// sees everything the snapshot saw, so the catch-up's reads (on any
// connection, in any number of chunks) see at least every transaction up to
// the position. Changes after it that a read also sees are replayed from the
// binlog over the read rows (tidemark.Snapshot).
func (r *Reader) Capture(ctx context.Context) (tidemark.Snapshot, error) {
	var s tidemark.Snapshot
	// A catch-up reads the tables as they are now: schemas cached by an
	// earlier run may be from before an ALTER TABLE.
	r.mu.Lock()
	clear(r.tables)
	r.mu.Unlock()
	var file, gtid, now string
	var pos uint64
	var err error
	file, pos, gtid, now, err = r.captureOutsideXA(ctx, func(ctx context.Context) (file string, pos uint64, gtid, now string, err error) {
		err = tidemark.Retry(ctx, "capture source position", queryRetry, isTransient, r.t.rl, func(ctx context.Context) error {
			var err error
			file, pos, gtid, now, err = r.capture(ctx)
			return err
		})
		return file, pos, gtid, now, err
	})
	if err != nil {
		return s, fmt.Errorf("capture position of %s: %w", r.t.cfg.Name, err)
	}
	st, err := r.t.readServer(ctx)
	if err != nil {
		return s, fmt.Errorf("capture position of %s: %w", r.t.cfg.Name, err)
	}
	epoch, changed := r.t.lin.epochFor(st.id)
	if changed {
		r.t.cfg.Logger.Warn("source identity changed since the last position: the catch-up's rows are in a new epoch", "source", r.t.cfg.Name, "server", st.id.String(), "epoch", epoch)
	}
	s.Position = tidemark.Position{File: file, Offset: pos, GTID: gtid, Epoch: epoch, Source: st.id}
	if t, _, err := parseCivil(now); err == nil {
		s.ServerTime = t
	}
	if s.Version, err = r.versionAt(file, pos, gtid, epoch); err != nil {
		return s, fmt.Errorf("capture position of %s: %w", r.t.cfg.Name, err)
	}
	return s, nil
}

// versionAt is the version just above every change of the binlog up to
// file/pos (GTID state gtid) in epoch: above every row the binlog holds
// there and below every row of the next transaction.
func (r *Reader) versionAt(file string, pos uint64, gtid string, epoch uint32) (tidemark.Version, error) {
	var v tidemark.Version
	switch r.t.cfg.Version {
	case VersionGTID:
		set, err := tidemark.ParseMariaDBGTIDSet(gtid)
		if err != nil {
			return v, err
		}
		if len(set) > 1 {
			return v, fmt.Errorf("GTID state %s has several domains: version: gtid needs one; set version: filepos", gtid)
		}
		// The snapshot saw transaction g.Seq and nothing after it:
		// (g.Seq+1, 0) is above every row of g.Seq and below every row
		// of the next transaction (strict mode: its sequence is higher).
		for _, g := range set {
			v = tidemark.Version{Seq: g.Seq + 1}
		}
	default:
		idx, err := tidemark.BinlogFileIndex(file)
		if err != nil {
			return v, err
		}
		// pos is where the next transaction starts, its rows are at
		// (pos, k≥1): (pos, 0) is above everything the snapshot saw and
		// below them.
		v = tidemark.Version{Seq: idx<<40 | pos}
	}
	var err error
	v.Seq, err = tidemark.EpochSeq(epoch, v.Seq)
	return v, err
}

// layoutSince returns the version a table's layout, read just before, is
// stamped with (tidemark.Table.Since): the version just above the
// binlog's end, read after the layout. A schema change is written to the
// binlog before the server shows its new layout (the ALTER holds the
// table's exclusive metadata lock until it has written its event, and
// information_schema waits on that lock), so every change of a layout
// older than the one read is below it. The stream's rows from the
// capture up to there are then of older layouts, or of this one, written
// into the table as it is (sink/postgres older.go), not taken for newer
// layouts that undo it: a MODIFY that widened a column between a first
// run's capture and its read of the table made the stream's older rows
// look like a narrowing, and the table was quarantined ("int(16 bits) →
// int(8 bits) cannot be followed losslessly"; nemesis seed 537566202643).
// Zero when the server is no longer the lineage's (the catch-up's
// versions are then of another epoch) or its GTID state has several
// domains under version: gtid (Capture refuses those).
func (r *Reader) layoutSince(ctx context.Context) (tidemark.Version, error) {
	var (
		file string
		pos  uint64
		st   serverState
	)
	err := tidemark.Retry(ctx, "read the binlog end of "+r.t.cfg.Name, queryRetry, isTransient, r.t.rl, func(ctx context.Context) error {
		res, err := r.t.mysqlStatus(ctx, func(ctx context.Context, q string) (*mysql.Result, error) { return r.t.query(ctx, q) })
		if err != nil {
			return err
		}
		if res.RowNumber() == 0 {
			return fmt.Errorf("SHOW MASTER STATUS is empty (log_bin off?): %w", tidemark.ErrSourceConfig)
		}
		file, _ = res.GetString(0, 0)
		pos, _ = res.GetUint(0, 1)
		st, err = r.t.readServer(ctx)
		return err
	})
	if err != nil {
		return tidemark.Version{}, fmt.Errorf("read the binlog end of %s: %w", r.t.cfg.Name, err)
	}
	epoch, changed := r.t.lin.epochFor(st.id)
	if changed {
		return tidemark.Version{}, nil
	}
	v, err := r.versionAt(file, pos, st.gtidPos, epoch)
	if err != nil {
		return tidemark.Version{}, nil // Capture reports it
	}
	return v, nil
}

// gtidAtEnd returns @@gtid_binlog_pos and the source clock, and whether the
// binlog ended at file/pos both just before and just after they were read
// (then the GTID state is exactly the one at file/pos).
func (r *Reader) gtidAtEnd(ctx context.Context, file string, pos uint64) (gtid, now string, exact bool, err error) {
	atEnd := func() (bool, error) {
		res, err := r.t.query(ctx, "SHOW MASTER STATUS")
		if err != nil {
			return false, err
		}
		if res.RowNumber() == 0 {
			return false, nil
		}
		f, _ := res.GetString(0, 0)
		p, _ := res.GetUint(0, 1)
		return f == file && p == pos, nil
	}
	if exact, err = atEnd(); err != nil || !exact {
		return "", "", false, err
	}
	res, err := r.t.query(ctx, "SELECT @@gtid_binlog_pos, UTC_TIMESTAMP(6)")
	if err != nil {
		return "", "", false, err
	}
	gtid, _ = res.GetString(0, 0)
	now, _ = res.GetString(0, 1)
	if exact, err = atEnd(); err != nil || !exact {
		return "", "", false, err
	}
	return gtid, now, true, nil
}

// capture reads a consistent binlog position on the metadata connection
// (see Capture).
func (r *Reader) capture(ctx context.Context) (file string, pos uint64, gtid, now string, err error) {
	if r.t.cfg.Flavor == FlavorMySQL && r.t.cfg.Capture != CaptureFlushTables {
		return r.captureLogStatus(ctx)
	}
	begin, end := "START TRANSACTION WITH CONSISTENT SNAPSHOT", "COMMIT"
	if r.t.cfg.Flavor != FlavorMariaDB {
		begin, end = "FLUSH TABLES WITH READ LOCK", "UNLOCK TABLES"
	}
	if _, err = r.t.query(ctx, begin); err != nil {
		return "", 0, "", "", fmt.Errorf("%s: %w", strings.ToLower(begin), err)
	}
	ended := false
	defer func() {
		if !ended {
			// Ends the transaction (or releases the lock) after an error;
			// a failed statement has already closed the connection.
			_, _ = r.t.query(ctx, end)
		}
	}()
	var res *mysql.Result
	if r.t.cfg.Flavor == FlavorMariaDB {
		if res, err = r.t.query(ctx, "SHOW STATUS LIKE 'binlog_snapshot_%'"); err != nil {
			return "", 0, "", "", err
		}
		for i := 0; i < res.RowNumber(); i++ {
			name, _ := res.GetString(i, 0)
			switch strings.ToLower(name) {
			case "binlog_snapshot_file":
				file, _ = res.GetString(i, 1)
			case "binlog_snapshot_position":
				v, _ := res.GetString(i, 1)
				pos, _ = strconv.ParseUint(v, 10, 64)
			}
		}
		if file == "" {
			return "", 0, "", "", fmt.Errorf("binlog_snapshot_file is empty (log_bin off?): %w", tidemark.ErrSourceConfig)
		}
		// The GTID state at exactly that position. When nothing was
		// written to the binlog after it, that is @@gtid_binlog_pos, read
		// between two binlog positions equal to the snapshot's: a group
		// being written holds LOCK_log, which SHOW MASTER STATUS waits
		// for, so a GTID state taken mid-group is followed by a position
		// past the snapshot's. Otherwise BINLOG_GTID_POS, which scans the
		// binlog file up to the position (seconds on a 1 GB file).
		var exact bool
		if gtid, now, exact, err = r.gtidAtEnd(ctx, file, pos); err != nil {
			return "", 0, "", "", err
		}
		if exact {
			ended = true
			if _, err = r.t.query(ctx, end); err != nil {
				return "", 0, "", "", fmt.Errorf("%s: %w", strings.ToLower(end), err)
			}
			return file, pos, gtid, now, nil
		}
		r.gtidScans.Add(1)
		if res, err = r.t.query(ctx, "SELECT BINLOG_GTID_POS(?, ?), UTC_TIMESTAMP(6)", file, pos); err != nil {
			return "", 0, "", "", err
		}
	} else {
		if res, err = r.t.mysqlStatus(ctx, func(ctx context.Context, q string) (*mysql.Result, error) { return r.t.query(ctx, q) }); err != nil {
			return "", 0, "", "", err
		}
		if res.RowNumber() == 0 {
			return "", 0, "", "", fmt.Errorf("SHOW BINARY LOG STATUS is empty (log_bin off?): %w", tidemark.ErrSourceConfig)
		}
		file, _ = res.GetString(0, 0)
		pos, _ = res.GetUint(0, 1)
		if res, err = r.t.query(ctx, "SELECT @@gtid_executed, UTC_TIMESTAMP(6)"); err != nil {
			return "", 0, "", "", err
		}
	}
	gtid, _ = res.GetString(0, 0)
	now, _ = res.GetString(0, 1)
	if r.t.cfg.Flavor == FlavorMySQL {
		if gtid, err = canonicalGTIDSet(gtid); err != nil {
			return "", 0, "", "", err
		}
	}
	ended = true
	if _, err = r.t.query(ctx, end); err != nil {
		return "", 0, "", "", fmt.Errorf("%s: %w", strings.ToLower(end), err)
	}
	return file, pos, gtid, now, nil
}

// captureLogStatus reads a MySQL source's position from
// performance_schema.log_status (MySQL 8.0.17+): the server holds commits
// and waits for the transactions already written to the binlog to commit in
// the engine (prep_xids) while it fills the row, so the binlog file and
// position and gtid_executed agree and every transaction they include is
// visible to a read that starts afterwards. Unlike FLUSH TABLES WITH READ
// LOCK it does not wait for running statements (a long SELECT), and managed
// MySQL services grant BACKUP_ADMIN where they refuse RELOAD's global lock.
func (r *Reader) captureLogStatus(ctx context.Context) (file string, pos uint64, gtid, now string, err error) {
	res, err := r.t.query(ctx, "SELECT LOCAL, UTC_TIMESTAMP(6) FROM performance_schema.log_status")
	if err != nil {
		var me *mysql.MyError
		if errors.As(err, &me) && (me.Code == mysql.ER_SPECIFIC_ACCESS_DENIED_ERROR || me.Code == mysql.ER_TABLEACCESS_DENIED_ERROR || me.Code == mysql.ER_NO_SUCH_TABLE) {
			return "", 0, "", "", fmt.Errorf("read performance_schema.log_status: %w (grant BACKUP_ADMIN ON *.* to the tidemark user, with performance_schema=ON; or set source.capture: flush_tables to capture under FLUSH TABLES WITH READ LOCK, which needs RELOAD and stalls every writer while it waits for the longest running statement): %w", err, tidemark.ErrSourceConfig)
		}
		return "", 0, "", "", fmt.Errorf("read performance_schema.log_status: %w", err)
	}
	if res.RowNumber() != 1 {
		return "", 0, "", "", fmt.Errorf("read performance_schema.log_status: %d rows", res.RowNumber())
	}
	local, _ := res.GetString(0, 0)
	now, _ = res.GetString(0, 1)
	var st struct {
		File string `json:"binary_log_file"`
		Pos  uint64 `json:"binary_log_position"`
		GTID string `json:"gtid_executed"`
	}
	if err := json.Unmarshal([]byte(local), &st); err != nil {
		return "", 0, "", "", fmt.Errorf("read performance_schema.log_status: LOCAL %.200q: %w", local, err)
	}
	if st.File == "" {
		return "", 0, "", "", fmt.Errorf("performance_schema.log_status has no binary log (log_bin off?): %w", tidemark.ErrSourceConfig)
	}
	if gtid, err = canonicalGTIDSet(st.GTID); err != nil {
		return "", 0, "", "", err
	}
	return st.File, st.Pos, gtid, now, nil
}

// Tables implements tidemark.SnapshotSource: the base tables that pass the
// include/exclude filter.
func (r *Reader) Tables(ctx context.Context) ([]tidemark.TableID, error) {
	res, err := r.exec(ctx, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY 1, 2")
	if err != nil {
		return nil, fmt.Errorf("list tables of %s: %w", r.t.cfg.Name, err)
	}
	var out []tidemark.TableID
	for i := 0; i < res.RowNumber(); i++ {
		db, _ := res.GetString(i, 0)
		tbl, _ := res.GetString(i, 1)
		if r.t.cfg.included(db, tbl) {
			out = append(out, tidemark.TableID{Database: db, Name: tbl})
		}
	}
	return out, nil
}

// Table returns the schema of a table as the reader decodes it.
func (r *Reader) Table(ctx context.Context, id tidemark.TableID) (*tidemark.Table, error) {
	rt, err := r.table(ctx, id)
	if err != nil {
		return nil, err
	}
	return rt.table, nil
}

// ForgetTables drops every cached schema: the next read of each table
// reads its schema again. A reader that does not Capture (an extra
// reader of a parallel snapshot) is told so after its catch-up's capture,
// so that a schema cached by an earlier run, from before an ALTER TABLE,
// does not decode rows read after it.
func (r *Reader) ForgetTables() {
	r.mu.Lock()
	clear(r.tables)
	r.mu.Unlock()
}

// Forget drops the cached schema of a table (after DDL).
func (r *Reader) Forget(id tidemark.TableID) {
	r.mu.Lock()
	delete(r.tables, id)
	r.mu.Unlock()
}

func (r *Reader) table(ctx context.Context, id tidemark.TableID) (*readTable, error) {
	r.mu.Lock()
	rt, ok := r.tables[id]
	r.mu.Unlock()
	if ok {
		return rt, nil
	}
	json, err := r.t.jsonColumns(ctx, id)
	if err != nil {
		return nil, err
	}
	delete(r.t.jsonCols, id) // re-read when the table is read again after DDL
	tbl, err := readSchema(ctx, &r.t.cfg, r.exec, json, id)
	if err != nil {
		return nil, err
	}
	if tbl.Since, err = r.layoutSince(ctx); err != nil {
		return nil, err
	}
	idx, err := r.t.readIndexes(ctx, id)
	if err != nil {
		return nil, err
	}
	uniq := uniqueColumns(idx)
	rt = &readTable{table: tbl}
	keys := tbl.KeyNames()
	for _, col := range tbl.Columns {
		env := &valueEnv{table: id, column: col.Name, zone: r.t.cfg.zoneFor(id, col.Name), zeroDates: r.t.cfg.ZeroDates, stats: &r.t.stats, span: new(tidemark.ZoneSpan),
			injective: injective(slices.Contains(keys, col.Name), uniq[strings.ToLower(col.Name)])}
		sel := tidemark.QuoteMySQL(col.Name)
		conv := env.convFor(col.Kind)
		switch col.Kind {
		case tidemark.KindFloat:
			// FLOAT's text form has 6 digits; widened to DOUBLE it
			// prints the exact float32 value.
			sel = "CAST(" + sel + " AS DOUBLE)"
		case tidemark.KindBit:
			sel = "CAST(" + sel + " AS UNSIGNED)"
		case tidemark.KindDate, tidemark.KindTime, tidemark.KindDateTime, tidemark.KindTimestamp:
			sel = castChar(sel)
		}
		if conv == nil { // text, ENUM, SET: the connection is utf8mb4, the server converts latin1
			conv = env.convText(nil)
		}
		rt.conv = append(rt.conv, bytesToString(col.Kind, conv))
		rt.bconv = append(rt.bconv, env.bytesConv(col.Kind))
		rt.selSQL = append(rt.selSQL, sel)
		rt.kinds = append(rt.kinds, col.Kind)
	}
	r.mu.Lock()
	r.tables[id] = rt
	r.mu.Unlock()
	return rt, nil
}

// stringFields are the result-set types of the string, binary, JSON, ENUM
// and SET columns.
var stringFields = map[uint8]bool{mysql.MYSQL_TYPE_VARCHAR: true, mysql.MYSQL_TYPE_VAR_STRING: true, mysql.MYSQL_TYPE_STRING: true,
	mysql.MYSQL_TYPE_TINY_BLOB: true, mysql.MYSQL_TYPE_MEDIUM_BLOB: true, mysql.MYSQL_TYPE_LONG_BLOB: true, mysql.MYSQL_TYPE_BLOB: true,
	mysql.MYSQL_TYPE_JSON: true, mysql.MYSQL_TYPE_ENUM: true, mysql.MYSQL_TYPE_SET: true}

// intFields are the result-set types of the integer widths.
var intFields = map[int]uint8{8: mysql.MYSQL_TYPE_TINY, 16: mysql.MYSQL_TYPE_SHORT, 24: mysql.MYSQL_TYPE_INT24, 32: mysql.MYSQL_TYPE_LONG, 64: mysql.MYSQL_TYPE_LONGLONG}

// sameTypes checks a chunk's result-set columns against the layout read
// before the chunk: an ALTER between the two (the layout read, then the
// SELECT waiting on the table's metadata lock while MODIFY COLUMN v
// BIGINT ran) returns the new layout's values, which the older layout's
// converters would pass on as its own (a 64-bit value in a 32-bit column:
// the scale-out appliers quarantined the table, "32-bit integer out of
// integer range"). Integers (width, sign) and decimals (scale) are
// checked: the types whose values the older layout cannot hold, and whose
// result-set type says so exactly; and that a string column still comes
// back as a string. A mismatch is ErrLayoutChanged.
func (rt *readTable) sameTypes(fields []*mysql.Field) error {
	if len(fields) != len(rt.table.Columns) {
		return fmt.Errorf("%d columns in the result for a layout of %d: %w", len(fields), len(rt.table.Columns), tidemark.ErrLayoutChanged)
	}
	for j, col := range rt.table.Columns {
		f := fields[j]
		switch col.Kind {
		case tidemark.KindInt, tidemark.KindUint:
			want, ok := intFields[col.Bits]
			unsigned := f.Flag&mysql.UNSIGNED_FLAG != 0
			if !ok || f.Type == want && unsigned == (col.Kind == tidemark.KindUint) {
				continue
			}
		case tidemark.KindDecimal:
			if f.Type == mysql.MYSQL_TYPE_NEWDECIMAL && int(f.Decimal) == col.Scale {
				continue
			}
		case tidemark.KindText, tidemark.KindBytes, tidemark.KindJSON, tidemark.KindEnum, tidemark.KindSet:
			// A string column made a number (MODIFY COLUMN c INT): its
			// converter would refuse every value ("want text, got int64")
			// and quarantine a table that only needs its layout read again.
			if stringFields[f.Type] {
				continue
			}
		default:
			continue
		}
		return fmt.Errorf("column %q comes back as MySQL type %d (flags %#x, %d decimals), not the %s (%d bits, scale %d) of the layout read before: %w",
			col.Name, f.Type, f.Flag, f.Decimal, col.Kind, col.Bits, col.Scale, tidemark.ErrLayoutChanged)
	}
	return nil
}

// undecodable marks a schema problem of one table (no key, an unsupported
// type, an invalid column name): a *tidemark.TableError, so that a catch-up
// quarantines the table instead of failing as a whole, as the Tailer does.
func undecodable(id tidemark.TableID, err error) error {
	return &tidemark.TableError{Table: id, Err: fmt.Errorf("%w: %w", err, tidemark.ErrUndecodable)}
}

// bytesToString adapts a converter to SQL results, where text arrives as
// []byte.
func bytesToString(k tidemark.Kind, c converter) converter {
	switch k {
	case tidemark.KindBytes, tidemark.KindText, tidemark.KindJSON:
		return c
	}
	return func(v any) (any, error) {
		if b, ok := v.([]byte); ok {
			v = string(b)
		}
		return c(v)
	}
}

// localBound formats a UTC instant as the column compares it: wall-clock
// digits in the column's source zone for DATETIME, UTC for TIMESTAMP (the
// session is at +00:00).
func (r *Reader) localBound(id tidemark.TableID, col tidemark.Column, t time.Time) string {
	if col.Kind == tidemark.KindDateTime {
		t = r.t.cfg.zoneFor(id, col.Name).ToLocal(t)
	}
	return t.UTC().Format("2006-01-02 15:04:05.000000")
}

// localLower is localBound for a window's lower bound: for a DATETIME, the
// local floor (tidemark.ZonePolicy.LocalFloor), which also covers the rows
// written in a repeated hour after the bound.
func (r *Reader) localLower(id tidemark.TableID, col tidemark.Column, t time.Time) string {
	if col.Kind == tidemark.KindDateTime {
		return r.t.cfg.zoneFor(id, col.Name).LocalFloor(t).Format("2006-01-02 15:04:05.000000")
	}
	return r.localBound(id, col, t)
}

func (rt *readTable) column(name string) (int, tidemark.Column, error) {
	i := rt.table.ColumnIndex(name)
	if i < 0 {
		return -1, tidemark.Column{}, fmt.Errorf("column %s not in table %s", name, rt.table.ID)
	}
	c := rt.table.Columns[i]
	if c.Kind != tidemark.KindDateTime && c.Kind != tidemark.KindTimestamp {
		return -1, c, fmt.Errorf("watermark column %s.%s is %s, want DATETIME or TIMESTAMP", rt.table.ID, name, c.Kind)
	}
	return i, c, nil
}

func tableSQL(id tidemark.TableID) string {
	return tidemark.QuoteMySQL(id.Database) + "." + tidemark.QuoteMySQL(id.Name)
}

// MaxTime implements tidemark.SnapshotSource.
func (r *Reader) MaxTime(ctx context.Context, id tidemark.TableID, column string) (time.Time, bool, error) {
	rt, err := r.table(ctx, id)
	if err != nil {
		return time.Time{}, false, err
	}
	i, _, err := rt.column(column)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read upper bound of %s: %w", id, err)
	}
	res, err := r.exec(ctx, "SELECT CAST(MAX("+tidemark.QuoteMySQL(column)+") AS CHAR) FROM "+tableSQL(id))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read upper bound of %s.%s: %w", id, column, err)
	}
	v, _ := res.GetValue(0, 0)
	if v == nil {
		return time.Time{}, false, nil
	}
	tv, err := rt.conv[i](v)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read upper bound of %s.%s: %w", id, column, err)
	}
	if tv == nil { // a zero date
		return time.Time{}, false, nil
	}
	return tv.(time.Time), true, nil
}

// CountAbove implements tidemark.SnapshotSource.
func (r *Reader) CountAbove(ctx context.Context, id tidemark.TableID, column string, t time.Time) (int64, error) {
	rt, err := r.table(ctx, id)
	if err != nil {
		return 0, err
	}
	_, col, err := rt.column(column)
	if err != nil {
		return 0, fmt.Errorf("count rows of %s: %w", id, err)
	}
	res, err := r.exec(ctx, "SELECT COUNT(*) FROM "+tableSQL(id)+" WHERE "+tidemark.QuoteMySQL(column)+" > ?", r.localBound(id, col, t))
	if err != nil {
		return 0, fmt.Errorf("count rows of %s above %s: %w", id, t, err)
	}
	n, _ := res.GetInt(0, 0)
	return n, nil
}

// keysetAfter builds "(c1, c2, …) > (?, ?, …)" expanded into ORs (which
// MariaDB turns into index ranges), with its arguments.
func keysetAfter(cols []string, vals []any) (string, []any) {
	var ors []string
	var args []any
	for i := range cols {
		var ands []string
		for j := 0; j < i; j++ {
			ands = append(ands, cols[j]+" = ?")
			args = append(args, vals[j])
		}
		ands = append(ands, cols[i]+" > ?")
		args = append(args, vals[i])
		ors = append(ors, "("+strings.Join(ands, " AND ")+")")
	}
	return "(" + strings.Join(ors, " OR ") + ")", args
}

// Read implements tidemark.SnapshotSource. With a watermark column it reads
// Lower < column ≤ Upper in (column, key) order (with Undated, the rows
// whose column is NULL or a zero date, in key order); without, the whole
// table in key order. The predicate compares the column in its own terms: the UTC
// bounds are converted to the column's source zone for a DATETIME.
func (r *Reader) Read(ctx context.Context, req tidemark.ReadRequest) (tidemark.ReadResult, error) {
	var out tidemark.ReadResult
	rt, err := r.table(ctx, req.Table)
	if err != nil {
		return out, err
	}
	if req.Limit <= 0 {
		req.Limit = 5000
	}
	var order []string // quoted cursor columns
	var orderIdx []int
	var where []string
	var args []any
	if req.Column != "" {
		ci, col, err := rt.column(req.Column)
		if err != nil {
			return out, fmt.Errorf("read %s: %w", req.Table, err)
		}
		if req.Undated {
			// NULL, and the zero dates (year 0, below every real value):
			// the rows the converters turn into NULL.
			where = append(where, "("+tidemark.QuoteMySQL(req.Column)+" IS NULL OR "+tidemark.QuoteMySQL(req.Column)+" < ?)")
			args = append(args, "0001-01-01 00:00:00")
		} else {
			order = append(order, tidemark.QuoteMySQL(req.Column))
			orderIdx = append(orderIdx, ci)
			if !req.Lower.IsZero() {
				where = append(where, tidemark.QuoteMySQL(req.Column)+" > ?")
				args = append(args, r.localLower(req.Table, col, req.Lower))
			}
			where = append(where, tidemark.QuoteMySQL(req.Column)+" <= ?")
			args = append(args, r.localBound(req.Table, col, req.Upper))
		}
	}
	for _, k := range rt.table.Key {
		order = append(order, tidemark.QuoteMySQL(rt.table.Columns[k].Name))
		orderIdx = append(orderIdx, k)
	}
	if req.KeyFrom != nil || req.KeyTo != nil {
		if req.Column != "" || len(rt.table.Key) == 0 || len(req.KeyFrom) > 1 || len(req.KeyTo) > 1 {
			return out, fmt.Errorf("read %s: a key range bounds the first key column of a full read", req.Table)
		}
		first := tidemark.QuoteMySQL(rt.table.Columns[rt.table.Key[0]].Name)
		if req.KeyFrom != nil {
			where = append(where, first+" > ?")
			args = append(args, req.KeyFrom[0])
		}
		switch {
		case req.KeyTo != nil && req.KeyFrom == nil:
			// The first range: NULLs (a nullable business key) sort
			// first and belong to it.
			where = append(where, "("+first+" <= ? OR "+first+" IS NULL)")
			args = append(args, req.KeyTo[0])
		case req.KeyTo != nil:
			where = append(where, first+" <= ?")
			args = append(args, req.KeyTo[0])
		}
	}
	if req.After != nil {
		if len(req.After) != len(order) {
			return out, fmt.Errorf("read %s: cursor has %d values for %d columns", req.Table, len(req.After), len(order))
		}
		cond, a := keysetAfter(order, req.After)
		where = append(where, cond)
		args = append(args, a...)
	}
	q := "SELECT " + strings.Join(rt.selSQL, ", ") + " FROM " + tableSQL(req.Table)
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY " + strings.Join(order, ", ") + " LIMIT " + strconv.Itoa(req.Limit)
	var onRow func([]mysql.FieldValue) error
	err = r.stream(ctx, q, args, func(fields []*mysql.Field) error {
		// A statement retried starts over.
		out, onRow = tidemark.ReadResult{}, rt.rowReader(req, orderIdx, &out)
		return rt.sameTypes(fields)
	}, func(fv []mysql.FieldValue) error { return onRow(fv) })
	if err != nil {
		var ce convError
		if errors.As(err, &ce) {
			return tidemark.ReadResult{}, ce.err
		}
		return tidemark.ReadResult{}, fmt.Errorf("read %s: %w", req.Table, err)
	}
	return out, nil
}

// convError is a value the layout's converters refused in Read, returned
// as the converter made it.
type convError struct{ err error }

func (e convError) Error() string { return e.err.Error() }
func (e convError) Unwrap() error { return e.err }

// readBlockRows is how many rows' values Read allocates at once.
const readBlockRows = 256

// rowReader returns Read's row callback: each row converted into a Change
// appended to out, and, once Limit rows came, out.Next from the last row's
// raw cursor values (as the server compares them, not normalized).
// Values are allocated readBlockRows rows at a time; the cursor columns of
// each row are kept (their bytes copied into buffers reused row to row)
// until the next row replaces them.
func (rt *readTable) rowReader(req tidemark.ReadRequest, orderIdx []int, out *tidemark.ReadResult) func([]mysql.FieldValue) error {
	nc := len(rt.conv)
	var block []any
	last := make([]mysql.FieldValue, len(orderIdx))
	lastBytes := make([][]byte, len(orderIdx))
	n := 0
	return func(fv []mysql.FieldValue) error {
		if n == 0 {
			out.Changes = make([]tidemark.Change, 0, min(req.Limit, 4096))
		}
		if len(block) < nc {
			block = make([]any, nc*readBlockRows)
		}
		row := block[:nc:nc]
		block = block[nc:]
		size := 96
		for j := range rt.conv {
			var v any
			switch fv[j].Type {
			case mysql.FieldValueTypeNull:
			case mysql.FieldValueTypeSigned:
				v = fv[j].AsInt64()
			case mysql.FieldValueTypeUnsigned:
				v = fv[j].AsUint64()
			case mysql.FieldValueTypeFloat:
				v = fv[j].AsFloat64()
			default:
				// Points into go-mysql's packet buffer: every converter
				// copies the bytes it keeps (string(b), append).
				b := fv[j].AsString()
				if bc := rt.bconv[j]; bc != nil {
					cv, err := bc(b)
					if err != nil {
						return convError{err}
					}
					row[j] = cv
					size += valueSize(cv)
					continue
				}
				v = b
			}
			cv, err := rt.conv[j](v)
			if err != nil {
				return convError{err}
			}
			row[j] = cv
			size += valueSize(cv)
		}
		out.Changes = append(out.Changes, tidemark.Change{
			Op: tidemark.OpRead, Table: rt.table, After: row, Version: req.Snapshot.Version,
			CommitTime: req.Snapshot.ServerTime, Size: size,
		})
		n++
		for i, ci := range orderIdx {
			last[i] = fv[ci]
			if fv[ci].Type == mysql.FieldValueTypeString {
				lastBytes[i] = append(lastBytes[i][:0], fv[ci].AsString()...)
			}
		}
		if n == req.Limit {
			next := make([]any, len(orderIdx))
			for i := range orderIdx {
				if last[i].Type == mysql.FieldValueTypeString {
					next[i] = string(lastBytes[i])
				} else {
					next[i] = last[i].Value()
				}
			}
			out.Next = next
		}
		return nil
	}
}

// KeySplits implements tidemark.KeySplitter. For an integer first key
// column whose values are dense (MAX − MIN at most four times InnoDB's row
// estimate: an auto-increment key), n-1 values evenly spaced between MIN
// and MAX (two index lookups); otherwise (sparse or skewed integers, other
// kinds) every (rows/n)-th value in key order (one index scan per split,
// each shorter than the table), so that the ranges hold about as many rows
// each. Values are raw, as the server compares them (like a cursor).
func (r *Reader) KeySplits(ctx context.Context, id tidemark.TableID, n int) ([]any, error) {
	rt, err := r.table(ctx, id)
	if err != nil {
		return nil, err
	}
	if n < 2 || len(rt.table.Key) == 0 {
		return nil, nil
	}
	ci := rt.table.Key[0]
	col := &rt.table.Columns[ci]
	first := tidemark.QuoteMySQL(col.Name)
	res, err := r.exec(ctx, "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", id.Database, id.Name)
	if err != nil {
		return nil, fmt.Errorf("split %s: %w", id, err)
	}
	var rows int64
	if res.RowNumber() > 0 {
		rows, _ = res.GetInt(0, 0)
	}
	if rows < 10000 {
		// The estimate of a table just loaded can be far off; counting
		// a small table is cheap.
		res, err := r.exec(ctx, "SELECT COUNT(*) FROM "+tableSQL(id))
		if err != nil {
			return nil, fmt.Errorf("split %s: %w", id, err)
		}
		rows, _ = res.GetInt(0, 0)
	}
	if rows < int64(n) {
		return nil, nil
	}
	if col.Kind == tidemark.KindInt || col.Kind == tidemark.KindUint {
		res, err := r.exec(ctx, "SELECT CAST(MIN("+first+") AS CHAR), CAST(MAX("+first+") AS CHAR) FROM "+tableSQL(id))
		if err != nil {
			return nil, fmt.Errorf("split %s: %w", id, err)
		}
		lo, _ := res.GetString(0, 0)
		hi, _ := res.GetString(0, 1)
		if lo == "" || hi == "" {
			return nil, nil // empty
		}
		if splits, dense, err := intSplits(lo, hi, n, rows); err != nil || dense {
			return splits, err
		}
	}
	var out []any
	for i := 1; i < n; i++ {
		res, err := r.exec(ctx, "SELECT "+rt.selSQL[ci]+" FROM "+tableSQL(id)+" ORDER BY "+first+" LIMIT 1 OFFSET ?", rows*int64(i)/int64(n))
		if err != nil {
			return nil, fmt.Errorf("split %s: %w", id, err)
		}
		if res.RowNumber() == 0 {
			break
		}
		v, err := res.GetValue(0, 0)
		if err != nil {
			return nil, fmt.Errorf("split %s: %w", id, err)
		}
		if v == nil {
			continue // NULLs sort first: the first range has them
		}
		v = cursorValue(v)
		if len(out) > 0 && fmt.Sprint(out[len(out)-1]) == fmt.Sprint(v) {
			continue // a value of many rows: its range is wider
		}
		out = append(out, v)
	}
	return out, nil
}

// intSplits returns up to n-1 distinct values evenly spaced in [lo, hi),
// from their decimal text (signed or unsigned 64-bit), when the span holds
// at most four values per row of the estimate (dense: false otherwise).
func intSplits(lo, hi string, n int, rows int64) ([]any, bool, error) {
	l, ok1 := new(big.Int).SetString(lo, 10)
	h, ok2 := new(big.Int).SetString(hi, 10)
	if !ok1 || !ok2 {
		return nil, false, fmt.Errorf("split: key bounds %q, %q are not integers", lo, hi)
	}
	span := new(big.Int).Sub(h, l)
	if span.Cmp(new(big.Int).Mul(big.NewInt(rows), big.NewInt(4))) > 0 {
		return nil, false, nil
	}
	var out []any
	for i := 1; i < n; i++ {
		v := new(big.Int).Mul(span, big.NewInt(int64(i)))
		v.Quo(v, big.NewInt(int64(n)))
		v.Add(v, l)
		if v.Cmp(h) >= 0 {
			break
		}
		var x any
		switch {
		case v.IsInt64():
			x = v.Int64()
		case v.IsUint64():
			x = v.Uint64()
		default:
			return nil, false, fmt.Errorf("split: key value %s is not a 64-bit integer", v)
		}
		if len(out) > 0 && out[len(out)-1] == x {
			continue
		}
		out = append(out, x)
	}
	return out, true, nil
}

// cursorValue turns a raw result value into a bind parameter.
func cursorValue(v any) any {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return v
}

// keyCanon returns the SQL for a key's canonical text (for checksums) and
// checks that the key's kinds have one canonical text form on both sides.
// The text is verify's (tidemark.RowHashInput): each part is length-prefixed
// ("3:a|b") or "N" for NULL, so ('a|b', 'c') and ('a', 'b|c') differ.
func (rt *readTable) keyCanon() (string, error) {
	var parts []string
	for _, k := range rt.table.Key {
		c := &rt.table.Columns[k]
		switch c.Kind {
		case tidemark.KindInt, tidemark.KindUint, tidemark.KindText:
			// integer and text: one canonical form on both flavors
			b := "CAST(" + vCanon(c, FlavorMariaDB) + " AS BINARY)"
			parts = append(parts, "IFNULL(CONCAT(LENGTH("+b+"), ':', "+b+"), 'N')")
		default:
			return "", fmt.Errorf("key diff of %s: key column %s is %s; key diff supports integer and text keys", rt.table.ID, c.Name, c.Kind)
		}
	}
	return "CONCAT_WS('|', " + strings.Join(parts, ", ") + ")", nil
}

// keyOrder returns the key columns in byte order (text as its UTF-8
// bytes, which PostgreSQL's COLLATE "C" reproduces). Not a collation: the
// utf8mb4 _bin collations are PAD SPACE, which put 'a\t' before 'a' where
// PostgreSQL puts it after, and the chunks of the two sides then cover
// different keys.
func (rt *readTable) keyOrder() []string {
	var cols []string
	for i := range rt.table.Key {
		cols = append(cols, vKeyOrder(&rt.table.Columns[rt.table.Key[i]]))
	}
	return cols
}

// KeySumSQL is the per-key hash both sides compute: the first 15 hex digits
// (60 bits) of the SHA-256 of the key's canonical text, summed as a decimal.
// SHA2(), not MD5(): MySQL 9.6 removed MD5() (into a component), and every
// supported server (MariaDB 10.x, MySQL 8.0–9.x) has SHA2(); `tidemark
// doctor` checks it.
const keyHashMy = "CAST(CONV(SUBSTRING(SHA2(%s, 256), 1, 15), 16, 10) AS UNSIGNED)"

// KeyChunk implements tidemark.SnapshotSource.
func (r *Reader) KeyChunk(ctx context.Context, id tidemark.TableID, after []any, limit int) (tidemark.KeyChunk, error) {
	var out tidemark.KeyChunk
	rt, err := r.table(ctx, id)
	if err != nil {
		return out, err
	}
	canon, err := rt.keyCanon()
	if err != nil {
		return out, err
	}
	order := rt.keyOrder()
	var sel []string
	for _, k := range rt.table.Key {
		sel = append(sel, tidemark.QuoteMySQL(rt.table.Columns[k].Name))
	}
	q := "SELECT " + strings.Join(sel, ", ") + ", " + fmt.Sprintf(keyHashMy, canon) + " FROM " + tableSQL(id)
	var args []any
	if after != nil {
		cond, a := keysetAfter(order, after)
		q += " WHERE " + cond
		args = a
	}
	q += " ORDER BY " + strings.Join(order, ", ") + " LIMIT " + strconv.Itoa(limit)
	res, err := r.exec(ctx, q, args...)
	if err != nil {
		return out, fmt.Errorf("list keys of %s: %w", id, err)
	}
	sum := new(big.Int)
	nk := len(rt.table.Key)
	for i := 0; i < res.RowNumber(); i++ {
		key := make([]any, nk)
		for j := 0; j < nk; j++ {
			v, _ := res.GetValue(i, j)
			key[j] = cursorValue(v)
		}
		h, _ := res.GetUint(i, nk)
		sum.Add(sum, new(big.Int).SetUint64(h))
		out.Keys = append(out.Keys, key)
	}
	out.Sum = tidemark.KeySum{Count: int64(len(out.Keys)), Sum: sum.String()}
	if len(out.Keys) == limit {
		out.Last = out.Keys[len(out.Keys)-1]
	}
	return out, nil
}

// KeyRangeSum implements tidemark.SnapshotSource.
func (r *Reader) KeyRangeSum(ctx context.Context, id tidemark.TableID, after, upTo []any) (tidemark.KeySum, error) {
	rt, err := r.table(ctx, id)
	if err != nil {
		return tidemark.KeySum{}, err
	}
	canon, err := rt.keyCanon()
	if err != nil {
		return tidemark.KeySum{}, err
	}
	order := rt.keyOrder()
	q := "SELECT COUNT(*), CAST(COALESCE(SUM(" + fmt.Sprintf(keyHashMy, canon) + "), 0) AS CHAR) FROM " + tableSQL(id)
	var where []string
	var args []any
	if after != nil {
		cond, a := keysetAfter(order, after)
		where = append(where, cond)
		args = append(args, a...)
	}
	if upTo != nil {
		cond, a := keysetAfter(order, upTo)
		where = append(where, "NOT "+cond)
		args = append(args, a...)
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	res, err := r.exec(ctx, q, args...)
	if err != nil {
		return tidemark.KeySum{}, fmt.Errorf("sum keys of %s: %w", id, err)
	}
	n, _ := res.GetInt(0, 0)
	s, _ := res.GetString(0, 1)
	return tidemark.KeySum{Count: n, Sum: s}, nil
}
