// Package mysqlprimary is a protocol-level MySQL 8 primary for tests: it
// speaks the server side of the MySQL protocol and writes MySQL 8 binlog
// events with vitess's go/mysql package (vitess.io/vitess, an
// implementation independent of go-mysql, which tidemark's tailer uses),
// and serves scripted binlog streams over TCP on a loopback port.
//
// What it serves: COM_BINLOG_DUMP (file/position) and COM_BINLOG_DUMP_GTID
// (auto-position with a UUID GTID set) over binlog files it writes from
// scripted transactions — GTID or anonymous, across several server UUIDs,
// with rotation, purge (error 1236 with MySQL's texts), compressed
// transaction payloads, XA, binary JSON and unknown events; the queries a
// replica issues at start (system variables, SHOW BINARY LOGS, SHOW MASTER
// STATUS in 8.0, SHOW BINARY LOG STATUS in 8.4, FLUSH TABLES WITH READ
// LOCK); the reads of a snapshot (information_schema lookups, prepared or
// not, and keyed SELECTs of a table) from the rows its transactions
// committed (tables.go); and results the test scripts for anything else. An
// unscripted query is answered with an error and recorded (Unscripted), so
// a test sees it.
//
// What it cannot prove is listed in docs/MYSQL.md: it is not a MySQL
// server; the event layouts are MySQL's documented formats as vitess and
// this package write them, not bytes captured from mysqld.
//
// It lives in the test tree: nothing in the tidemark binary imports it.
package mysqlprimary

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	vtmysql "vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/replication"
	"vitess.io/vitess/go/mysql/sqlerror"
	"vitess.io/vitess/go/sqltypes"
	querypb "vitess.io/vitess/go/vt/proto/query"
	"vitess.io/vitess/go/vt/vtenv"
)

// MySQL's texts for error 1236 (ER_SOURCE_FATAL_ERROR_READING_BINLOG),
// as 8.0.26+ and 8.4 send them (share/messages_to_clients.txt).
const (
	MsgFileNotFound = "Could not find first log file name in binary log index file"
	MsgPosTooLarge  = "Client requested source to start replication from position > file size"
	// MsgGTIDPurged is ER_SOURCE_HAS_PURGED_REQUIRED_GTIDS; its two %s are
	// the replica's GTID set and the missing transactions.
	MsgGTIDPurged = "Cannot replicate because the source purged required binary logs. Replicate the missing transactions from elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration period. The GTID set sent by the replica is '%s', and the missing transactions are '%s'"
	// MsgReplicaAhead is ER_REPLICA_HAS_MORE_GTIDS_THAN_SOURCE.
	MsgReplicaAhead = "Replica has more GTIDs than the source has, using the source's SERVER_UUID. This may indicate that the end of the binary log was truncated or that the last binary log file was lost, e.g., after a power or disk failure when sync_binlog != 1. The source may or may not have rolled back transactions that were already replicated to the replica. Suggest to replicate any transactions that source has rolled back from replica to source, and/or commit empty transactions on source to account for transactions that have been committed on source but are not included in GTID_EXECUTED."
)

// Config configures a Primary.
type Config struct {
	// Version is the server version, "8.0.40" (default) or "8.4.3": it
	// decides which status statement exists (SHOW MASTER STATUS until
	// 8.0, SHOW BINARY LOG STATUS from 8.2) and the format description.
	Version string
	// ServerUUID is @@server_uuid; GTIDs written without a UUID use it.
	ServerUUID string
	// ServerID is @@server_id (default 1).
	ServerID uint32
	// User and Password are the only account (mysql_native_password).
	User, Password string
	// Basename is the binlog basename (default "binlog", MySQL 8's).
	Basename string
	// Addr is where to listen (default "127.0.0.1:0", a free port); a
	// primary that replaces another one (a failover) can take its address.
	Addr string
	// Vars overrides system variables (see defaults in Start).
	Vars map[string]string
}

// Primary is a running protocol-level MySQL 8 primary.
type Primary struct {
	cfg Config
	l   *vtmysql.Listener

	mu         sync.Mutex
	vars       map[string]string
	files      []*file
	purged     int // files[:purged] are purged
	gtidPurged replication.Mysql56GTIDSet
	executed   replication.Mysql56GTIDSet
	changed    chan struct{} // closed and replaced at every append
	closed     bool
	conns      map[*vtmysql.Conn]bool
	answers    map[string]*sqltypes.Result
	queries    []string
	unscripted []string
	hbPeriod   map[uint32]time.Duration
	seq        int64
	served     int // transactions sent to replicas
	data       map[string]*tableData
	xaRows     map[string][]Row // rows of prepared XA transactions
	done       chan struct{}
	wg         sync.WaitGroup
}

// Start creates a primary listening on a free loopback port, with one
// binlog file (binlog.000001) holding its format description and
// previous-GTIDs events.
func Start(cfg Config) (*Primary, error) {
	if cfg.Version == "" {
		cfg.Version = "8.0.40"
	}
	if cfg.ServerID == 0 {
		cfg.ServerID = 1
	}
	if cfg.ServerUUID == "" {
		cfg.ServerUUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	}
	if cfg.Basename == "" {
		cfg.Basename = "binlog"
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.User == "" {
		cfg.User = "tidemark"
	}
	p := &Primary{
		cfg: cfg,
		vars: map[string]string{
			"log_bin": "1", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL",
			"gtid_mode": "ON", "enforce_gtid_consistency": "ON", "binlog_checksum": "CRC32",
			"binlog_transaction_compression": "0", "binlog_row_value_options": "",
			"server_uuid": cfg.ServerUUID, "server_id": strconv.Itoa(int(cfg.ServerID)),
			"version": cfg.Version, "log_bin_basename": "/var/lib/mysql/" + cfg.Basename,
			"time_zone": "SYSTEM", "system_time_zone": "UTC", "sql_mode": "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
			"binlog_expire_logs_seconds": "2592000", "log_replica_updates": "1", "log_slave_updates": "1",
		},
		gtidPurged: replication.Mysql56GTIDSet{},
		executed:   replication.Mysql56GTIDSet{},
		changed:    make(chan struct{}),
		conns:      map[*vtmysql.Conn]bool{},
		answers:    map[string]*sqltypes.Result{},
		hbPeriod:   map[uint32]time.Duration{},
		done:       make(chan struct{}),
		data:       map[string]*tableData{},
		xaRows:     map[string][]Row{},
	}
	for k, v := range cfg.Vars {
		p.vars[strings.ToLower(k)] = v
	}
	p.rotateLocked()
	auth := vtmysql.NewAuthServerStatic("", fmt.Sprintf(`{%q: [{"Password": %q}]}`, cfg.User, cfg.Password), 0)
	env, err := vtenv.New(vtenv.Options{MySQLServerVersion: cfg.Version})
	if err != nil {
		return nil, fmt.Errorf("start MySQL primary: %w", err)
	}
	h := &handler{p: p, env: env}
	l, err := vtmysql.NewListener("tcp", cfg.Addr, auth, h, 0, 0, false, false, 0, 0, false)
	if err != nil {
		return nil, fmt.Errorf("start MySQL primary: %w", err)
	}
	l.ServerVersion = cfg.Version
	p.l = l
	p.wg.Add(1)
	go func() { // owned: ends when Close closes the listener
		defer p.wg.Done()
		l.Accept()
	}()
	return p, nil
}

// Addr is the primary's host:port.
func (p *Primary) Addr() string { return p.l.Addr().String() }

// Close stops the primary: the listener and every connection (a dump in
// progress ends as when mysqld shuts down).
func (p *Primary) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	conns := make([]*vtmysql.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.l.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// SetVar sets a system variable (as SET GLOBAL would).
func (p *Primary) SetVar(name, value string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.vars[strings.ToLower(name)] = value
}

// Answer scripts the result of a query: columns and rows of text values
// (nil for NULL). The query is matched after collapsing white space,
// case-insensitively.
func (p *Primary) Answer(query string, columns []string, rows ...[]any) {
	r := textResult(columns, rows...)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answers[normalize(query)] = r
}

// Queries returns every query received, in order.
func (p *Primary) Queries() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.queries...)
}

// Unscripted returns the queries the primary could not answer.
func (p *Primary) Unscripted() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unscripted...)
}

// Served returns how many transactions the primary has sent to replicas.
func (p *Primary) Served() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served
}

func (p *Primary) format() vtmysql.BinlogFormat {
	return format(p.cfg.Version, p.vars["binlog_checksum"] == "CRC32")
}

// newWriter starts writing at the end of the current file.
func (p *Primary) newWriter(gtid string) *writer {
	f := p.files[len(p.files)-1]
	return &writer{
		f:    p.format(),
		s:    &vtmysql.FakeBinlogStream{ServerID: p.cfg.ServerID, Timestamp: uint32(time.Now().Unix())},
		file: &file{name: f.name, size: f.size},
		gtid: gtid,
	}
}

// append commits a writer's events to the current file.
func (p *Primary) append(w *writer) {
	f := p.files[len(p.files)-1]
	f.events = append(f.events, w.events...)
	f.size = w.file.size
	close(p.changed)
	p.changed = make(chan struct{})
}

var binlogEventsRE = regexp.MustCompile(`^show binlog events in '([^']+)' limit 2$`)

// rotateLocked ends the current file with a ROTATE_EVENT and starts the
// next one with a FORMAT_DESCRIPTION_EVENT and PREVIOUS_GTIDS_LOG_EVENT.
func (p *Primary) rotateLocked() {
	name := fmt.Sprintf("%s.%06d", p.cfg.Basename, len(p.files)+1)
	if len(p.files) > 0 {
		w := p.newWriter("")
		w.addBuilt(func() vtmysql.BinlogEvent { return vtmysql.NewRotateEvent(w.f, w.s, 4, name) })
		p.append(w)
	}
	p.files = append(p.files, &file{name: name, size: 4, prev: p.executed.String()})
	w := p.newWriter("")
	w.addBuilt(func() vtmysql.BinlogEvent { return vtmysql.NewFormatDescriptionEvent(w.f, w.s) })
	w.add(evPreviousGTIDs, 0, previousGTIDsBody(p.executed))
	p.append(w)
}

// Rotate is FLUSH BINARY LOGS: the next transactions go to a new file.
func (p *Primary) Rotate() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rotateLocked()
}

// PurgeTo is PURGE BINARY LOGS TO name: the files before it are gone, and
// their GTIDs are added to @@gtid_purged.
func (p *Primary) PurgeTo(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range p.files {
		if f.name != name {
			continue
		}
		for _, old := range p.files[p.purged:i] {
			for _, ev := range old.events {
				if ev.gtid != "" {
					g, _ := replication.ParseMysql56GTID(ev.gtid)
					p.gtidPurged = p.gtidPurged.AddGTID(g).(replication.Mysql56GTIDSet)
				}
			}
		}
		if i > p.purged {
			p.purged = i
		}
		return nil
	}
	return fmt.Errorf("purge binary logs to %s: no such file", name)
}

// Txn is a transaction to write.
type Txn struct {
	// GTID is "uuid:n", "n" (this server's UUID), or "" for an anonymous
	// transaction (gtid_mode=OFF).
	GTID string
	// DB is the default database of its statements.
	DB   string
	Rows []Row
}

// Commit writes a transaction: GTID (or anonymous GTID), BEGIN, table
// maps and rows, XID.
func (p *Primary) Commit(t Txn) error {
	return p.write(t.GTID, t.Rows, func(w *writer) error {
		w.query(t.DB, "BEGIN")
		if err := w.rowEvents(t.Rows); err != nil {
			return err
		}
		w.xid()
		return nil
	})
}

// CommitCompressed writes a transaction as MySQL does with
// binlog_transaction_compression=ON: its GTID event, then one
// TRANSACTION_PAYLOAD_EVENT holding BEGIN, table maps, rows and XID,
// compressed with zstd.
func (p *Primary) CommitCompressed(t Txn) error {
	return p.write(t.GTID, t.Rows, func(w *writer) error {
		inner := &writer{f: w.f, s: w.s, file: &file{size: 4}}
		inner.query(t.DB, "BEGIN")
		if err := inner.rowEvents(t.Rows); err != nil {
			return err
		}
		inner.xid()
		body, err := payloadBody(innerEvents(w.f, inner.events))
		if err != nil {
			return err
		}
		w.add(evTransactionPayload, 0, body)
		return nil
	})
}

// XAPrepare writes XA START, the rows, XA END and XA PREPARE (an
// XA_PREPARE_LOG_EVENT) as one GTID transaction; onePhase writes XA COMMIT
// … ONE PHASE instead (the same events, one_phase set).
func (p *Primary) XAPrepare(gtid, db, xid string, rows []Row, onePhase bool) error {
	committed := rows
	if !onePhase {
		committed = nil
	}
	return p.write(gtid, committed, func(w *writer) error {
		if !onePhase {
			p.xaRows[xid] = rows
		}
		w.query(db, "XA START "+xaID(xid))
		if err := w.rowEvents(rows); err != nil {
			return err
		}
		w.query(db, "XA END "+xaID(xid))
		w.add(evXAPrepare, 0, xaPrepareBody(xid, onePhase))
		return nil
	})
}

// XACommit writes XA COMMIT of a prepared XA transaction (its own GTID).
func (p *Primary) XACommit(gtid, db, xid string) error {
	return p.write(gtid, nil, func(w *writer) error {
		w.query(db, "XA COMMIT "+xaID(xid))
		p.apply(p.xaRows[xid])
		delete(p.xaRows, xid)
		return nil
	})
}

// XARollback writes XA ROLLBACK of a prepared XA transaction.
func (p *Primary) XARollback(gtid, db, xid string) error {
	return p.write(gtid, nil, func(w *writer) error {
		w.query(db, "XA ROLLBACK "+xaID(xid))
		delete(p.xaRows, xid)
		return nil
	})
}

// RawEvent writes an event of any type with the given body inside a
// transaction after its rows (before the XID), e.g. an event type tidemark
// does not know; rows may be empty.
func (p *Primary) RawEvent(gtid, db string, rows []Row, typ byte, body []byte) error {
	return p.write(gtid, rows, func(w *writer) error {
		w.query(db, "BEGIN")
		if err := w.rowEvents(rows); err != nil {
			return err
		}
		w.add(typ, 0, body)
		w.xid()
		return nil
	})
}

// write appends one transaction: its GTID event (with the transaction's
// length), then what fill writes; rows are the rows it commits.
func (p *Primary) write(gtid string, rows []Row, fill func(*writer) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gtid != "" && !strings.Contains(gtid, ":") {
		gtid = p.cfg.ServerUUID + ":" + gtid
	}
	// The rest of the transaction is built first to know its length,
	// then again after the GTID event at the right positions.
	probe := p.newWriter(gtid)
	saved := p.xaRows
	p.xaRows = map[string][]Row{} // the probe must not change the XA state
	for k, v := range saved {
		p.xaRows[k] = v
	}
	savedData := p.data
	p.data = map[string]*tableData{}
	err := fill(probe)
	p.xaRows, p.data = saved, savedData
	if err != nil {
		return err
	}
	restLen := uint64(probe.file.size - p.files[len(p.files)-1].size)
	p.seq++
	w := p.newWriter(gtid)
	typ := byte(evGTID)
	if gtid == "" {
		typ = evAnonymousGTID
	}
	var body []byte
	for guess := restLen + 19 + 4 + 60; ; {
		b, err := gtidBody(gtid, p.seq-1, p.seq, uint64(time.Now().UnixMicro()), guess, p.cfg.Version)
		if err != nil {
			return err
		}
		total := restLen + uint64(19+len(b)+4)
		if total == guess {
			body = b
			break
		}
		guess = total
	}
	w.add(typ, 0, body)
	if err := fill(w); err != nil {
		return err
	}
	p.append(w)
	p.apply(rows)
	if gtid != "" {
		g, _ := replication.ParseMysql56GTID(gtid)
		p.executed = p.executed.AddGTID(g).(replication.Mysql56GTIDSet)
	}
	return nil
}

// handler implements vitess's server-side Handler.
type handler struct {
	vtmysql.UnimplementedHandler
	p   *Primary
	env *vtenv.Environment
}

// Env is the vitess environment (server version, collations).
func (h *handler) Env() *vtenv.Environment { return h.env }

// NewConnection records a connection, so that Close can end it.
func (h *handler) NewConnection(c *vtmysql.Conn) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.p.conns[c] = true
}

// ConnectionClosed forgets a connection.
func (h *handler) ConnectionClosed(c *vtmysql.Conn) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	delete(h.p.conns, c)
	delete(h.p.hbPeriod, c.ConnectionID)
}

// WarningCount is 0: the primary raises no warnings.
func (h *handler) WarningCount(*vtmysql.Conn) uint16 { return 0 }

// ComQueryMulti answers one query at a time, as ComQuery.
func (h *handler) ComQueryMulti(c *vtmysql.Conn, sql string, callback func(sqltypes.QueryResponse, bool, bool) error) error {
	return h.ComQuery(c, sql, func(r *sqltypes.Result) error {
		return callback(sqltypes.QueryResponse{QueryResult: r}, false, true)
	})
}

// ComRegisterReplica accepts COM_REGISTER_SLAVE.
func (h *handler) ComRegisterReplica(*vtmysql.Conn, string, uint16, string, string) error { return nil }

var (
	spaceRE   = regexp.MustCompile(`\s+`)
	selVarsRE = regexp.MustCompile(`(?i)^select\s+(@@[\w.]+(\s*,\s*(@@[\w.]+|utc_timestamp\(6\)))*)$`)
	hbRE      = regexp.MustCompile(`(?i)@(master|source)_heartbeat_period\s*=\s*(\d+)`)
	likeRE    = regexp.MustCompile(`(?i)^show\s+(global\s+|session\s+)?variables\s+like\s+'([^']*)'$`)
)

func normalize(q string) string {
	return strings.ToLower(strings.TrimSpace(spaceRE.ReplaceAllString(strings.TrimRight(strings.TrimSpace(q), ";"), " ")))
}

func parseError(near string) error {
	return sqlerror.NewSQLError(sqlerror.ERParseError, sqlerror.SSClientError,
		"You have an error in your SQL syntax; check the manual that corresponds to your MySQL server version for the right syntax to use near '"+near+"' at line 1")
}

// textResult is a result set of text columns; a nil value is NULL.
func textResult(columns []string, rows ...[]any) *sqltypes.Result {
	fields := make([]*querypb.Field, len(columns))
	for i, c := range columns {
		fields[i] = &querypb.Field{Name: c, Type: querypb.Type_VARCHAR}
	}
	r := &sqltypes.Result{Fields: fields}
	for _, row := range rows {
		vals := make([]sqltypes.Value, len(row))
		for i, v := range row {
			if v == nil {
				vals[i] = sqltypes.NULL
				continue
			}
			vals[i] = sqltypes.NewVarChar(fmt.Sprint(v))
		}
		r.Rows = append(r.Rows, vals)
	}
	return r
}

// numericVars are answered as integers, as MySQL types them.
var numericVars = map[string]bool{"log_bin": true, "server_id": true, "binlog_transaction_compression": true,
	"binlog_expire_logs_seconds": true, "log_replica_updates": true, "log_slave_updates": true}

// ComQuery answers a text-protocol query (see answer), recording it.
func (h *handler) ComQuery(c *vtmysql.Conn, query string, callback func(*sqltypes.Result) error) error {
	p := h.p
	q := normalize(query)
	p.mu.Lock()
	p.queries = append(p.queries, query)
	if m := hbRE.FindStringSubmatch(query); m != nil {
		ns, _ := strconv.ParseInt(m[2], 10, 64)
		p.hbPeriod[c.ConnectionID] = time.Duration(ns)
	}
	r, err := h.answer(q)
	if r == nil && err == nil {
		p.unscripted = append(p.unscripted, query)
		err = sqlerror.NewSQLError(sqlerror.ERNotSupportedYet, sqlerror.SSUnknownSQLState, "mysqlprimary: unscripted query: "+query)
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return callback(r)
}

// answer returns the result of a query (with p.mu held), nil if unknown.
func (h *handler) answer(q string) (*sqltypes.Result, error) {
	p := h.p
	if r, ok := p.answers[q]; ok {
		return r, nil
	}
	if r, err := p.tableAnswer(q, nil); r != nil || err != nil {
		return r, err
	}
	is84 := strings.HasPrefix(p.cfg.Version, "8.4")
	switch {
	case strings.HasPrefix(q, "set "):
		return &sqltypes.Result{}, nil
	case q == "flush tables with read lock" || q == "unlock tables":
		return &sqltypes.Result{}, nil
	case q == "select version()":
		return textResult([]string{"VERSION()"}, []any{p.cfg.Version}), nil
	case q == "show grants for current_user()":
		// The grants tidemark's docs ask for, as MySQL 8 prints them.
		return textResult([]string{"Grants for " + p.cfg.User + "@%"},
			[]any{"GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `" + p.cfg.User + "`@`%`"},
			[]any{"GRANT BACKUP_ADMIN ON *.* TO `" + p.cfg.User + "`@`%`"}), nil
	case q == "select local, utc_timestamp(6) from performance_schema.log_status":
		// MySQL 8.0.17+: the binlog position and gtid_executed, consistent.
		f := p.files[len(p.files)-1]
		local, err := json.Marshal(map[string]any{"gtid_executed": mysqlSetText(p.executed), "binary_log_file": f.name, "binary_log_position": f.size})
		if err != nil {
			return nil, err
		}
		return textResult([]string{"LOCAL", "UTC_TIMESTAMP(6)"}, []any{string(local), time.Now().UTC().Format("2006-01-02 15:04:05.000000")}), nil
	case strings.HasPrefix(q, "kill "):
		// KILL <id>: go-mysql ends its dump connection this way.
		id, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(q, "kill "), "connection "), 10, 32)
		if err != nil {
			return nil, parseError(q[len("kill "):])
		}
		for c := range p.conns {
			if c.ConnectionID == uint32(id) {
				go c.Close() // not under p.mu: Close calls ConnectionClosed
				return &sqltypes.Result{}, nil
			}
		}
		return nil, sqlerror.NewSQLErrorf(sqlerror.ERNoSuchThread, sqlerror.SSUnknownSQLState, "Unknown thread id: %d", id)
	case binlogEventsRE.MatchString(q):
		// The first two events of a file (the tailer reads the
		// Previous_gtids of the new primary's files after a failover).
		name := binlogEventsRE.FindStringSubmatch(q)[1]
		for _, f := range p.files[p.purged:] {
			if f.name == name {
				cols := []string{"Log_name", "Pos", "Event_type", "Server_id", "End_log_pos", "Info"}
				return textResult(cols,
					[]any{f.name, 4, "Format_desc", p.cfg.ServerID, 126, "Server ver: " + p.cfg.Version + ", Binlog ver: 4"},
					[]any{f.name, 126, "Previous_gtids", p.cfg.ServerID, 197, f.prev}), nil
			}
		}
		return nil, sqlerror.NewSQLErrorf(sqlerror.ERMasterFatalReadingBinlog, sqlerror.SSUnknownSQLState, "Error when executing command SHOW BINLOG EVENTS: Could not find target log")
	case q == "show binary logs":
		var rows [][]any
		for _, f := range p.files[p.purged:] {
			rows = append(rows, []any{f.name, f.size, "No"})
		}
		return textResult([]string{"Log_name", "File_size", "Encrypted"}, rows...), nil
	case q == "show master status":
		if is84 {
			return nil, parseError("MASTER STATUS")
		}
		return h.status(), nil
	case q == "show binary log status":
		if !is84 {
			return nil, parseError("LOG STATUS")
		}
		return h.status(), nil
	}
	if m := likeRE.FindStringSubmatch(q); m != nil {
		name := strings.ToLower(m[2])
		if v, ok := p.vars[name]; ok {
			return textResult([]string{"Variable_name", "Value"}, []any{name, v}), nil
		}
		return textResult([]string{"Variable_name", "Value"}), nil
	}
	if selVarsRE.MatchString(q) {
		items := strings.Split(strings.TrimSpace(q[len("select"):]), ",")
		r := &sqltypes.Result{}
		var row []sqltypes.Value
		for _, it := range items {
			it = strings.TrimSpace(it)
			if it == "utc_timestamp(6)" {
				r.Fields = append(r.Fields, &querypb.Field{Name: "UTC_TIMESTAMP(6)", Type: querypb.Type_DATETIME})
				row = append(row, sqltypes.NewDatetime(time.Now().UTC().Format("2006-01-02 15:04:05.000000")))
				continue
			}
			name := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(it, "@@"), "global."), "session.")
			v, ok := p.vars[name]
			if name == "gtid_executed" {
				v, ok = mysqlSetText(p.executed), true
			}
			if name == "gtid_purged" {
				v, ok = mysqlSetText(p.gtidPurged), true
			}
			if !ok {
				return nil, sqlerror.NewSQLError(sqlerror.ERUnknownSystemVariable, sqlerror.SSUnknownSQLState, "Unknown system variable '"+name+"'")
			}
			if numericVars[name] {
				n, _ := strconv.ParseInt(v, 10, 64)
				r.Fields = append(r.Fields, &querypb.Field{Name: it, Type: querypb.Type_INT64})
				row = append(row, sqltypes.NewInt64(n))
				continue
			}
			r.Fields = append(r.Fields, &querypb.Field{Name: it, Type: querypb.Type_VARCHAR})
			row = append(row, sqltypes.NewVarChar(v))
		}
		r.Rows = [][]sqltypes.Value{row}
		return r, nil
	}
	return nil, nil
}

// status is the row of SHOW MASTER STATUS / SHOW BINARY LOG STATUS.
func (h *handler) status() *sqltypes.Result {
	f := h.p.files[len(h.p.files)-1]
	return textResult([]string{"File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set"},
		[]any{f.name, f.size, "", "", mysqlSetText(h.p.executed)})
}

// mysqlSetText prints a GTID set as MySQL does in @@gtid_executed and SHOW
// … STATUS: a newline after each comma.
func mysqlSetText(s replication.Mysql56GTIDSet) string {
	return strings.ReplaceAll(s.String(), ",", ",\n")
}

func fatal(format string, args ...any) error {
	return sqlerror.NewSQLErrorf(sqlerror.ERMasterFatalReadingBinlog, sqlerror.SSUnknownSQLState, format, args...)
}

// ComBinlogDump serves COM_BINLOG_DUMP: from a file and offset.
func (h *handler) ComBinlogDump(c *vtmysql.Conn, logFile string, binlogPos uint32) error {
	p := h.p
	p.mu.Lock()
	idx := -1
	for i, f := range p.files[p.purged:] {
		if f.name == logFile {
			idx = p.purged + i
		}
	}
	if idx < 0 {
		p.mu.Unlock()
		return fatal(MsgFileNotFound)
	}
	if binlogPos > p.files[idx].size {
		p.mu.Unlock()
		return fatal(MsgPosTooLarge)
	}
	p.mu.Unlock()
	return h.dump(c, idx, binlogPos, nil)
}

// ComBinlogDumpGTID serves COM_BINLOG_DUMP_GTID: every transaction whose
// GTID is not in the replica's set, from the oldest retained file.
func (h *handler) ComBinlogDumpGTID(c *vtmysql.Conn, _ string, _ uint64, gtidSet replication.GTIDSet, _ uint16) error {
	p := h.p
	set, _ := gtidSet.(replication.Mysql56GTIDSet)
	if set == nil {
		set = replication.Mysql56GTIDSet{}
	}
	p.mu.Lock()
	// The replica must not have GTIDs of this server that it never wrote.
	if sid, err := replication.ParseSID(p.cfg.ServerUUID); err == nil {
		mine := replication.Mysql56GTIDSet{}
		if ivs, ok := set[sid]; ok {
			mine[sid] = ivs
		}
		if !p.executed.Contains(mine) {
			p.mu.Unlock()
			return fatal("%s", MsgReplicaAhead)
		}
	}
	if !set.Contains(p.gtidPurged) {
		missing := p.gtidPurged.Difference(set)
		p.mu.Unlock()
		return fatal(MsgGTIDPurged, set.String(), missing.String())
	}
	start := p.purged
	p.mu.Unlock()
	return h.dump(c, start, 4, set)
}

// dump streams events from files[idx] at pos, skipping the transactions in
// skip, then waits for more, sending heartbeats, until the connection or
// the primary closes.
func (h *handler) dump(c *vtmysql.Conn, idx int, pos uint32, skip replication.Mysql56GTIDSet) error {
	p := h.p
	p.mu.Lock()
	hb := p.hbPeriod[c.ConnectionID]
	f := p.files[idx]
	noCRC := format(p.cfg.Version, false)
	p.mu.Unlock()
	s := &vtmysql.FakeBinlogStream{ServerID: p.cfg.ServerID}
	// A fake rotate names the file (no checksum: the replica set
	// @source_binlog_checksum), then its format description.
	if err := c.WriteBinlogEvent(vtmysql.NewMysql56BinlogEvent(s.Packetize(noCRC, evRotate, vtmysql.FlagLogEventArtificial,
		append(le64(uint64(pos)), f.name...))), false); err != nil {
		return err
	}
	next := 0 // index of the next event of f to send
	if pos > 4 {
		fde := append([]byte(nil), f.events[0].raw...)
		// The file's format description comes first even when the
		// replica starts in the middle of the file.
		if err := c.WriteBinlogEvent(vtmysql.NewMysql56BinlogEvent(fde), false); err != nil {
			return err
		}
		for next < len(f.events) && f.events[next].pos < pos {
			next++
		}
	}
	for {
		p.mu.Lock()
		var batch []event
		if next < len(f.events) {
			batch = append(batch, f.events[next:]...)
			next = len(f.events)
		}
		hasNext := idx+1 < len(p.files)
		changed := p.changed
		p.mu.Unlock()
		for _, ev := range batch {
			if skip != nil && ev.gtid != "" {
				g, _ := replication.ParseMysql56GTID(ev.gtid)
				if skip.ContainsGTID(g) {
					continue
				}
			}
			if err := c.WriteBinlogEvent(vtmysql.NewMysql56BinlogEvent(ev.raw), false); err != nil {
				return err
			}
			if ev.raw[4] == evGTID || ev.raw[4] == evAnonymousGTID {
				p.mu.Lock()
				p.served++
				p.mu.Unlock()
			}
		}
		if err := c.FlushWriteBuffer(); err != nil {
			return err
		}
		if hasNext && len(batch) == 0 {
			p.mu.Lock()
			idx++
			f = p.files[idx]
			next = 0
			p.mu.Unlock()
			continue
		}
		if len(batch) > 0 {
			continue
		}
		if hb <= 0 {
			hb = time.Hour
		}
		t := time.NewTimer(hb)
		select {
		case <-changed:
			t.Stop()
		case <-p.done:
			t.Stop()
			return sqlerror.NewSQLError(sqlerror.ERServerShutdown, sqlerror.SSNetError, "Server shutdown in progress")
		case <-t.C:
			p.mu.Lock()
			s.LogPosition = f.size
			ev := s.Packetize(p.format(), evHeartbeat, 0, []byte(f.name))
			p.mu.Unlock()
			if err := c.WriteBinlogEvent(vtmysql.NewMysql56BinlogEvent(ev), false); err != nil {
				return err
			}
			if err := c.FlushWriteBuffer(); err != nil {
				return err
			}
		}
	}
}

func le64(n uint64) []byte {
	b := make([]byte, 8)
	for i := range b {
		b[i] = byte(n >> (8 * i))
	}
	return b
}
