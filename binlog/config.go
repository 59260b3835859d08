// Package binlog tails a MySQL or MariaDB binlog with go-mysql's pull API
// and turns row events into UTC-normalized tidemark changes.
//
// It owns go-mysql: no go-mysql type leaves this package. Rows are decoded
// with the column names, key and types of the table-map event they were
// written with (binlog_row_metadata=FULL), never with the table's current
// schema, so a backlog that crosses an ALTER TABLE decodes correctly.
package binlog

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"time"

	"tidemark"
)

// Flavors of source server.
const (
	FlavorMariaDB = "mariadb"
	FlavorMySQL   = "mysql"

	// CaptureLogStatus and CaptureFlushTables are the values of
	// Config.Capture.
	CaptureLogStatus   = "log_status"
	CaptureFlushTables = "flush_tables"
)

// Version modes: what orders a source's changes (see tidemark.Version).
const (
	VersionGTID    = "gtid"
	VersionFilePos = "filepos"
)

// Zero-date policies.
const (
	ZeroDateNull  = "null"
	ZeroDateError = "error"
)

// Config configures a Tailer. The zero value is not valid: Addr, User,
// ServerID and Name are required. Defaults are documented per field.
type Config struct {
	// Name identifies the source (its checkpoint row). Required.
	Name string
	// Flavor is "mariadb" (default) or "mysql".
	Flavor string
	// Capture is how a MySQL source's binlog position is captured for a
	// snapshot or a catch-up (MariaDB always uses START TRANSACTION WITH
	// CONSISTENT SNAPSHOT): CaptureLogStatus (default) reads
	// performance_schema.log_status (BACKUP_ADMIN), which holds commits
	// only while it is read; CaptureFlushTables takes FLUSH TABLES WITH
	// READ LOCK (RELOAD), which waits for every running statement and
	// stalls every writer meanwhile.
	Capture string
	// Addr is host:port of the source server. Required.
	Addr string
	// User and Password authenticate; the password never appears in a log
	// line or an error.
	User, Password string
	// TLS is how every connection to the source (replication streams and
	// SQL sessions) uses TLS. Mode's default: verify-full when CAFile is
	// set; otherwise require, except to a loopback address (127.0.0.0/8,
	// ::1, localhost), where it is disable: off the host the binlog stream
	// carries every row and the password, so it is never plain text unless
	// asked for; on the host there is no network to protect.
	TLS tidemark.TLSConfig
	// ServerID is the replica server id tidemark registers with; it must
	// be unique among the source's replicas. Required (never random).
	ServerID uint32
	// Version is "gtid" (default for MariaDB: GTID sequence number of one
	// domain) or "filepos" (default for MySQL).
	Version string

	// Zone is how DATETIME values (zone-less) are read: the source zone
	// and the DST fold/gap policy. Location nil means UTC.
	Zone tidemark.ZonePolicy
	// ZoneOverrides overrides Zone per table ("db.table") or per column
	// ("db.table.column"); a column override wins over a table override.
	ZoneOverrides map[string]tidemark.ZonePolicy
	// ZeroDates is "null" (default: a zero date becomes NULL and is
	// counted) or "error".
	ZeroDates string

	// Include lists "db.table" patterns (path.Match syntax, e.g. "shop.*")
	// of tables to replicate; empty means every table outside the system
	// schemas. Exclude removes tables from that set.
	Include, Exclude []string
	// BusinessKeys overrides the primary key per table ("db.table" →
	// column names), e.g. a composite (order_id, line_item_id).
	BusinessKeys map[string][]string
	// ExcludeColumns removes columns per table ("db.table" pattern, in
	// path.Match syntax like Include → column names), e.g. PII: the
	// Tailer and the Reader drop them before anything else sees a row (the
	// Reader does not even select them), so their values never leave this
	// process. A key column cannot be excluded.
	ExcludeColumns map[string][]string

	// MaxChunkBytes bounds the estimated size of one chunk (default 4 MiB);
	// a transaction larger than that is split into several chunks.
	MaxChunkBytes int
	// MaxChunkChanges bounds the changes in one chunk (default 10000).
	MaxChunkChanges int
	// Heartbeat is the interval the server sends heartbeats at (default
	// 5s); ReadTimeout (default 3×Heartbeat) detects a half-open
	// connection.
	Heartbeat, ReadTimeout time.Duration
	// QueryTimeout bounds every wait on a source SQL connection (catch-up
	// and snapshot reads, key diffs, verify, schema lookups while
	// streaming): the handshake and each packet of a statement's answer.
	// A half-open connection then fails the statement with a timeout
	// instead of hanging it (default 5m; raise it if a statement can run
	// longer than that before its first row).
	QueryTimeout time.Duration
	// Backoff shapes reconnects after transient errors (Attempts 0 =
	// forever while progress is made; default 20 attempts without
	// progress).
	Backoff tidemark.Backoff
	// ServerIDTakenFor bounds how long the stream keeps taking its
	// ServerID back from another client that registered with it
	// (tidemark.ErrServerIDInUse), each time after its pipeline proved
	// that this process is still the source's only writer
	// (tidemark.WriterCheckable): a client that keeps taking it for
	// longer is another replica with the same id, and the stream stops
	// with one error naming the id (default 1m).
	ServerIDTakenFor time.Duration
	// Logger receives the tailer's and go-mysql's logs (default discard).
	Logger *slog.Logger
}

var systemSchemas = map[string]bool{"mysql": true, "information_schema": true, "performance_schema": true, "sys": true}

// The defaults of Config's zero fields (Flavor, Version, ZeroDates and
// the zone policy default to the named values above; ReadTimeout to three
// heartbeats; TLS.Mode as tlsMode says).
const (
	// DefaultMaxChunkBytes is MaxChunkBytes' default.
	DefaultMaxChunkBytes = 4 << 20
	// DefaultMaxChunkChanges is MaxChunkChanges' default.
	DefaultMaxChunkChanges = 10000
	// DefaultHeartbeat is Heartbeat's default (source.heartbeat).
	DefaultHeartbeat = 5 * time.Second
	// DefaultQueryTimeout is QueryTimeout's default (source.query_timeout).
	DefaultQueryTimeout = 5 * time.Minute
	// DefaultBackoffAttempts is Backoff.Attempts' default.
	DefaultBackoffAttempts = 20
	// DefaultServerIDTakenFor is ServerIDTakenFor's default.
	DefaultServerIDTakenFor = time.Minute
)

// queryRetry is how source queries outside the stream (snapshot and
// catch-up reads, position captures, schema lookups) retry transient
// errors: for up to 30 s, which a server restart or a failover behind one
// address takes (five quick attempts gave up within a second, and a
// restart during a first-run snapshot stopped the daemon).
var queryRetry = tidemark.Backoff{Max: 2 * time.Second, For: 30 * time.Second}

func (c *Config) setDefaults() {
	if c.Flavor == "" {
		c.Flavor = FlavorMariaDB
	}
	c.TLS.Mode = c.tlsMode()
	if c.Version == "" {
		if c.Flavor == FlavorMariaDB {
			c.Version = VersionGTID
		} else {
			c.Version = VersionFilePos
		}
	}
	if c.ZeroDates == "" {
		c.ZeroDates = ZeroDateNull
	}
	if c.Zone.Fold == "" {
		c.Zone.Fold = tidemark.ResolveLater
	}
	if c.Zone.Gap == "" {
		c.Zone.Gap = tidemark.ResolveLater
	}
	if c.Zone.Location == nil {
		c.Zone.Location = time.UTC
	}
	if c.MaxChunkBytes <= 0 {
		c.MaxChunkBytes = DefaultMaxChunkBytes
	}
	if c.MaxChunkChanges <= 0 {
		c.MaxChunkChanges = DefaultMaxChunkChanges
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 3 * c.Heartbeat
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.Backoff.Attempts == 0 {
		c.Backoff.Attempts = DefaultBackoffAttempts
	}
	if c.ServerIDTakenFor <= 0 {
		c.ServerIDTakenFor = DefaultServerIDTakenFor
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// tlsMode is TLS.Mode or its default (see Config.TLS).
func (c *Config) tlsMode() string {
	switch {
	case c.TLS.Mode != "":
		return c.TLS.Mode
	case c.TLS.CAFile != "":
		return tidemark.TLSVerifyFull
	case tidemark.IsLoopback(c.Addr):
		return tidemark.TLSDisable
	}
	return tidemark.TLSRequire
}

// Validate checks the config; errors name the field.
func (c *Config) Validate() error {
	c.setDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("source config: %s: %s", field, fmt.Sprintf(format, args...)))
	}
	if c.Name == "" {
		bad("name", "required")
	} else if !tidemark.ValidIdentifier(c.Name) {
		bad("name", "invalid %q", c.Name)
	}
	if c.Capture != "" && c.Capture != CaptureLogStatus && c.Capture != CaptureFlushTables {
		bad("capture", "%q is not %s or %s", c.Capture, CaptureLogStatus, CaptureFlushTables)
	}
	if c.Flavor != FlavorMariaDB && c.Flavor != FlavorMySQL {
		bad("flavor", "must be %q or %q, got %q", FlavorMariaDB, FlavorMySQL, c.Flavor)
	}
	if c.Version != VersionGTID && c.Version != VersionFilePos {
		bad("version", "must be %q or %q, got %q", VersionGTID, VersionFilePos, c.Version)
	}
	if c.Flavor == FlavorMySQL && c.Version == VersionGTID {
		bad("version", "%q is only for MariaDB (MySQL GTID sets are not totally ordered); use %q", VersionGTID, VersionFilePos)
	}
	if c.Addr == "" {
		bad("addr", "required")
	} else if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		bad("addr", "want host:port: %v", err)
	}
	if c.User == "" {
		bad("user", "required")
	}
	if err := c.TLS.Validate("tls"); err != nil {
		errs = append(errs, fmt.Errorf("source config: %w", err))
	}
	if c.ServerID == 0 {
		bad("server_id", "required and must be > 0 (unique among the source's replicas)")
	}
	if c.ZeroDates != ZeroDateNull && c.ZeroDates != ZeroDateError {
		bad("zero_dates", "must be %q or %q, got %q", ZeroDateNull, ZeroDateError, c.ZeroDates)
	}
	checkZone := func(field string, z tidemark.ZonePolicy) {
		if z.Fold != "" && !z.Fold.Valid() {
			bad(field+".fold", "must be earlier, later or error, got %q", z.Fold)
		}
		if z.Gap != "" && !z.Gap.Valid() {
			bad(field+".gap", "must be earlier, later or error, got %q", z.Gap)
		}
	}
	checkZone("zone", c.Zone)
	for k, z := range c.ZoneOverrides {
		if n := strings.Count(k, "."); n < 1 || n > 2 {
			bad("zone_overrides", "key %q must be db.table or db.table.column", k)
		}
		checkZone("zone_overrides."+k, z)
	}
	for _, p := range append(append([]string{}, c.Include...), c.Exclude...) {
		if _, err := path.Match(p, "x.y"); err != nil || !strings.Contains(p, ".") {
			bad("include/exclude", "pattern %q must be db.table (path.Match syntax)", p)
		}
	}
	for k, cols := range c.BusinessKeys {
		if strings.Count(k, ".") != 1 {
			bad("business_keys", "key %q must be db.table", k)
		}
		if len(cols) == 0 {
			bad("business_keys."+k, "needs at least one column")
		}
		for _, col := range cols {
			if !tidemark.ValidIdentifier(col) {
				bad("business_keys."+k, "invalid column %q", col)
			}
		}
	}
	for k, cols := range c.ExcludeColumns {
		if _, err := path.Match(k, "x.y"); err != nil || strings.Count(k, ".") != 1 {
			bad("exclude_columns", "key %q must be db.table (path.Match syntax)", k)
		}
		if len(cols) == 0 {
			bad("exclude_columns."+k, "needs at least one column")
		}
		for _, col := range cols {
			if !tidemark.ValidIdentifier(col) {
				bad("exclude_columns."+k, "invalid column %q", col)
			}
			for bk, keys := range c.BusinessKeys {
				if m, _ := path.Match(k, bk); m {
					for _, key := range keys {
						if strings.EqualFold(key, col) {
							bad("exclude_columns."+k, "column %q is in business_keys.%s: a key column cannot be excluded", col, bk)
						}
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// excludedColumns returns the columns excluded from a table (lower case;
// MySQL column names are case-insensitive), or nil.
func (c *Config) excludedColumns(id tidemark.TableID) map[string]bool {
	var out map[string]bool
	for k, cols := range c.ExcludeColumns {
		if m, _ := path.Match(k, id.String()); !m {
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		for _, col := range cols {
			out[strings.ToLower(col)] = true
		}
	}
	return out
}

// included reports whether a table passes the include/exclude filter.
func (c *Config) included(db, table string) bool {
	name := db + "." + table
	if len(c.Include) == 0 {
		if systemSchemas[strings.ToLower(db)] {
			return false
		}
	} else {
		ok := false
		for _, p := range c.Include {
			if m, _ := path.Match(p, name); m {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, p := range c.Exclude {
		if m, _ := path.Match(p, name); m {
			return false
		}
	}
	return true
}

// zoneFor returns the zone policy of a column.
func (c *Config) zoneFor(id tidemark.TableID, column string) tidemark.ZonePolicy {
	z := c.Zone
	if o, ok := c.ZoneOverrides[id.String()]; ok {
		z = merge(z, o)
	}
	if o, ok := c.ZoneOverrides[id.String()+"."+column]; ok {
		z = merge(z, o)
	}
	return z
}

func merge(base, o tidemark.ZonePolicy) tidemark.ZonePolicy {
	if o.Location != nil {
		base.Location = o.Location
	}
	if o.Fold != "" {
		base.Fold = o.Fold
	}
	if o.Gap != "" {
		base.Gap = o.Gap
	}
	return base
}
