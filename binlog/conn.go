package binlog

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"tidemark"
)

// The connections of package binlog to the source: SQL statements through
// sqlConns (connectSQL, sqlErr), replication streams through syncerConfig.

// connectSQL opens a source SQL connection whose handshake and every read
// and write wait at most cfg.QueryTimeout: without it a half-open
// connection hangs a catch-up read, a verify or a schema lookup forever.
// go-mysql sets the socket's write deadline before each packet; the read
// deadline is deadlineConn's.
func connectSQL(ctx context.Context, cfg *Config) (*client.Conn, error) {
	tc, err := clientTLS(cfg)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil || cfg.QueryTimeout <= 0 {
			return c, err
		}
		return &deadlineConn{Conn: c, timeout: cfg.QueryTimeout}, nil
	}
	c, err := client.ConnectWithDialer(dctx, "", cfg.Addr, cfg.User, cfg.Password, "", dial, func(c *client.Conn) error {
		c.ReadTimeout, c.WriteTimeout = 0, cfg.QueryTimeout
		if tc != nil {
			c.SetTLSConfig(tc)
		}
		return nil
	})
	if err != nil {
		err, _ = connErr(cfg, sqlErr(cfg, err))
		return nil, fmt.Errorf("connect to source %s at %s: %w", cfg.Name, cfg.Addr, err)
	}
	return c, nil
}

// deadlineConn bounds every read's wait for the server by timeout, as
// go-mysql's ReadTimeout does, at a fraction of its cost: go-mysql moves the
// socket's read deadline before each packet, which is each row of a result
// (14% of a snapshot's CPU, the runtime's timer updates). Here a read moves
// it only when it was last moved more than timeout/8 ago, to timeout×9/8
// from then, so that each wait is bounded by between timeout and
// timeout×9/8. One goroutine reads a connection at a time (go-mysql's).
type deadlineConn struct {
	net.Conn
	timeout time.Duration
	moved   time.Time // when the read deadline was last set
}

func (c *deadlineConn) Read(b []byte) (int, error) {
	if now := time.Now(); now.Sub(c.moved) > c.timeout/8 {
		if err := c.Conn.SetReadDeadline(now.Add(c.timeout + c.timeout/8)); err != nil {
			return 0, err
		}
		c.moved = now
	}
	return c.Conn.Read(b)
}

// clientTLS is the TLS configuration of a connection to the source (nil:
// plain text). The files are read on every connect, so that renewed
// certificates are used without a restart.
func clientTLS(cfg *Config) (*tls.Config, error) {
	host, _, _ := net.SplitHostPort(cfg.Addr)
	t := cfg.TLS
	t.Mode = cfg.tlsMode()
	tc, err := t.ClientConfig("source.tls", host)
	if err != nil {
		return nil, fmt.Errorf("connect to source %s at %s: %w", cfg.Name, cfg.Addr, err)
	}
	return tc, nil
}

// connErr explains what TLS has to do with a failed connect: a certificate
// that did not verify (tidemark.TLSError; never retried, see isTransient),
// a server without TLS, or an account that refuses plain text. changed
// reports whether it was one of them.
func connErr(cfg *Config, err error) (_ error, changed bool) {
	if tidemark.IsTLSVerifyError(err) {
		return tidemark.TLSError(cfg.TLS, err), true
	}
	if noServerTLS(err) {
		return fmt.Errorf("%w (source.tls.mode is %s: enable TLS on the server, or set source.tls.mode: disable to connect in plain text)", err, cfg.TLS.Mode), true
	}
	var me *mysql.MyError
	if cfg.TLS.Mode == tidemark.TLSDisable && errors.As(err, &me) && me.Code == mysql.ER_ACCESS_DENIED_ERROR {
		return fmt.Errorf("%w (source.tls.mode is disable: an account created with REQUIRE SSL refuses plain-text connections; set source.tls)", err), true
	}
	return err, false
}

// replConnErr is connErr for a replication connection: what it explains
// is prefixed with the source and its address.
func replConnErr(cfg *Config, err error) error {
	if e, changed := connErr(cfg, err); changed {
		return fmt.Errorf("connect to source %s at %s: %w", cfg.Name, cfg.Addr, e)
	}
	return err
}

func noServerTLS(err error) bool { return strings.Contains(err.Error(), "does not support TLS") }

// sqlErr redacts a source SQL error and says what a timeout means.
func sqlErr(cfg *Config, err error) error {
	err = redact(err, cfg.Password)
	if err != nil && strings.Contains(err.Error(), "i/o timeout") {
		return fmt.Errorf("no answer from source %s at %s within query_timeout %s (a half-open connection?): %w", cfg.Name, cfg.Addr, cfg.QueryTimeout, err)
	}
	return err
}

// sqlConns holds a component's SQL connections to the source, opened with
// connectSQL and set up with the session statements setup (what fails there
// is named by purpose). A statement that fails drops its connection; its
// error is redacted (sqlErr). go-mysql has no context support: ctx bounds
// only the connect, Config.QueryTimeout every wait for an answer.
//
// A shared sqlConns keeps one session for every statement, pinged before
// each reuse (the tailer's: a capture runs several statements in one
// transaction on it). Otherwise each statement takes an idle connection or
// opens one, so that concurrent statements run on their own (the
// verifier's).
type sqlConns struct {
	cfg     *Config
	setup   []string
	purpose string // "verify session", in "set up <purpose> on source …"
	shared  bool

	mu   sync.Mutex
	idle []*client.Conn // shared: at most one, in use or not
}

// conn returns a connection for one statement.
func (p *sqlConns) conn(ctx context.Context) (*client.Conn, error) {
	p.mu.Lock()
	if p.shared {
		defer p.mu.Unlock()
		if len(p.idle) == 1 {
			if err := p.idle[0].Ping(); err == nil {
				return p.idle[0], nil
			}
			_ = p.idle[0].Close()
			p.idle = nil
		}
	} else {
		if n := len(p.idle); n > 0 {
			c := p.idle[n-1]
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			return c, nil
		}
		p.mu.Unlock()
	}
	c, err := connectSQL(ctx, p.cfg)
	if err != nil {
		return nil, err
	}
	for _, s := range p.setup {
		if _, err := c.Execute(s); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("set up %s on source %s: %w", p.purpose, p.cfg.Name, sqlErr(p.cfg, err))
		}
	}
	if p.shared {
		p.idle = []*client.Conn{c}
	}
	return c, nil
}

// exec runs one statement. On a shared session it runs even when ctx is
// done: a capture's deferred COMMIT or UNLOCK TABLES must still release
// what it took.
func (p *sqlConns) exec(ctx context.Context, q string, args ...any) (*mysql.Result, error) {
	if err := ctx.Err(); err != nil && !p.shared {
		return nil, err
	}
	c, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	r, err := c.Execute(q, args...)
	if err != nil {
		p.release(c, false)
		return nil, sqlErr(p.cfg, err)
	}
	p.release(c, true)
	return r, nil
}

// release ends a statement on c: a connection whose statement failed
// (ok false) is closed, a healthy one is kept for the next statement.
func (p *sqlConns) release(c *client.Conn, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		_ = c.Close()
		if p.shared && len(p.idle) == 1 && p.idle[0] == c {
			p.idle = nil
		}
		return
	}
	if !p.shared {
		p.idle = append(p.idle, c)
	}
}

// stream runs one SELECT and hands its rows to row one at a time as they
// arrive, instead of buffering the whole result as exec does (a snapshot
// chunk: thousands of rows whose parsed copies exec would hold at once).
// go-mysql reuses the row and the bytes its values point into between
// calls, so row copies what it keeps. fields sees the result's columns
// before the first row. With args the statement is prepared (binary
// protocol), as exec runs it. An error of fields or row ends the statement
// and is returned as it is; any error drops the connection, whose unread
// rows would otherwise answer the next statement.
func (p *sqlConns) stream(ctx context.Context, q string, args []any, fields func([]*mysql.Field) error, row func([]mysql.FieldValue) error) error {
	if err := ctx.Err(); err != nil && !p.shared {
		return err
	}
	c, err := p.conn(ctx)
	if err != nil {
		return err
	}
	var cbErr error
	onRow := func(r []mysql.FieldValue) error {
		if err := row(r); err != nil {
			cbErr = err
			return err
		}
		return nil
	}
	onResult := func(r *mysql.Result) error {
		if err := fields(r.Fields); err != nil {
			cbErr = err
			return err
		}
		return nil
	}
	var res mysql.Result
	if len(args) == 0 {
		err = c.ExecuteSelectStreaming(q, &res, onRow, onResult)
	} else {
		var st *client.Stmt
		if st, err = c.Prepare(q); err == nil {
			err = st.ExecuteSelectStreaming(&res, onRow, onResult, args...)
			if err == nil {
				err = st.Close()
			}
		}
	}
	p.release(c, err == nil)
	switch {
	case cbErr != nil:
		return cbErr
	case err != nil:
		return sqlErr(p.cfg, err)
	}
	return nil
}

// close closes the idle connections (call it when no statement runs).
func (p *sqlConns) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, c := range p.idle {
		errs = append(errs, c.Close())
	}
	p.idle = nil
	return errors.Join(errs...)
}

// syncerConfig is the part of a replication connection's configuration
// that every binlog stream of cfg's source shares: address, account,
// flavor, and no retry inside go-mysql (the callers reconnect themselves).
func syncerConfig(cfg *Config, serverID uint32) (replication.BinlogSyncerConfig, error) {
	host, portStr, _ := net.SplitHostPort(cfg.Addr)
	port, _ := strconv.Atoi(portStr)
	tc, err := clientTLS(cfg)
	if err != nil {
		return replication.BinlogSyncerConfig{}, err
	}
	return replication.BinlogSyncerConfig{
		ServerID:         serverID,
		Flavor:           cfg.Flavor,
		Host:             host,
		Port:             uint16(port),
		User:             cfg.User,
		Password:         cfg.Password,
		TLSConfig:        tc,
		DisableRetrySync: true,
	}, nil
}
