package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"tidemark"
)

// SASL mechanisms (SASLConfig.Mechanism).
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Security is how every client of the package (the sink's producer and
// admin client, the checkpoint reader, the appliers, GroupStatus) connects
// to the brokers. The zero value is plain text without authentication.
type Security struct {
	// TLS, when set, dials the brokers with TLS. Its Mode defaults to
	// verify-full (CAFile, else the system's roots; the name checked is
	// each broker's host, or ServerName).
	TLS *tidemark.TLSConfig
	// SASL, when set, authenticates every connection.
	SASL *SASLConfig
}

// SASLConfig is a SASL login. The password never appears in a log line,
// an error or a record.
type SASLConfig struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string
	// User and Password authenticate.
	User, Password string
}

// tlsDefaults fills TLS.Mode's default.
func (s Security) withDefaults() Security {
	if s.TLS != nil && s.TLS.Mode == "" {
		t := *s.TLS
		t.Mode = tidemark.TLSVerifyFull
		s.TLS = &t
	}
	return s
}

// validate checks s after withDefaults; errors are *ConfigError.
func (s Security) validate() error {
	_, err := s.opts()
	return err
}

// opts are the franz-go options of s (after withDefaults).
func (s Security) opts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if s.TLS != nil {
		if s.TLS.Mode == tidemark.TLSDisable {
			return nil, cfgErr("tls.mode", "disable: remove the tls section to connect in plain text")
		}
		// No host: franz-go sets each broker's own as ServerName.
		tc, err := s.TLS.ClientConfig("tls", "")
		if err != nil {
			field, problem, _ := strings.Cut(err.Error(), ": ")
			return nil, cfgErr(field, "%s", problem)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if a := s.SASL; a != nil {
		switch {
		case a.User == "":
			return nil, cfgErr("sasl.user", "required")
		case a.Password == "":
			return nil, cfgErr("sasl.password", "required (password or password_file)")
		}
		var m sasl.Mechanism
		switch a.Mechanism {
		case SASLPlain:
			if s.TLS == nil {
				return nil, cfgErr("sasl.mechanism", "PLAIN sends the password in clear: set tls too (SASL_SSL), or use SCRAM-SHA-256/512")
			}
			m = plain.Auth{User: a.User, Pass: a.Password}.AsMechanism()
		case SASLScramSHA256:
			m = scram.Auth{User: a.User, Pass: a.Password}.AsSha256Mechanism()
		case SASLScramSHA512:
			m = scram.Auth{User: a.User, Pass: a.Password}.AsSha512Mechanism()
		default:
			return nil, cfgErr("sasl.mechanism", "must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", a.Mechanism)
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// secret is the SASL password ("" without SASL), redacted from errors.
func (s Security) secret() string {
	if s.SASL == nil {
		return ""
	}
	return s.SASL.Password
}

// ErrKafkaAuth marks an error no retry can heal: the brokers refused the
// SASL login, their certificate did not verify, or they and the config
// disagree about TLS or SASL.
var ErrKafkaAuth = errors.New("kafka: connection refused by its security settings (not retried)")

// authErr explains an error that is a refused login or certificate (and
// wraps ErrKafkaAuth), or returns err unchanged. The password is never in
// its text.
func authErr(sec Security, brokers []string, err error) error {
	if err == nil {
		return nil
	}
	var msg string
	switch {
	case tidemark.IsTLSVerifyError(err):
		msg = fmt.Sprintf("kafka brokers %s: %v", strings.Join(brokers, ","), tidemark.TLSError(*sec.TLS, err))
	case mismatch(err):
		msg = fmt.Sprintf("kafka brokers %s and target.kafka disagree about TLS or SASL (tls %s, sasl %s): %v", strings.Join(brokers, ","),
			map[bool]string{true: "set", false: "not set"}[sec.TLS != nil], map[bool]string{true: "set", false: "not set"}[sec.SASL != nil], err)
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.UnsupportedSaslMechanism):
		mech := ""
		if sec.SASL != nil {
			mech = sec.SASL.Mechanism + " as " + sec.SASL.User
		}
		msg = fmt.Sprintf("kafka brokers %s refused the SASL login (%s): %v", strings.Join(brokers, ","), mech, err)
	default:
		return err
	}
	if p := sec.secret(); p != "" {
		msg = strings.ReplaceAll(msg, p, "***")
	}
	return fmt.Errorf("%s: %w", msg, ErrKafkaAuth)
}

// checkAuth connects (a metadata request), so that a refused login or
// certificate, or a client and brokers that disagree about TLS or SASL,
// fail at once with authErr instead of inside the first retried operation
// (franz-go retries a connection the broker closes at once, as it does for
// a broker that restarts: such a close is taken for a mismatch only when
// it repeats, three times a second apart).
func checkAuth(ctx context.Context, cl *kgo.Client, sec Security, brokers []string) error {
	for attempt := 1; ; attempt++ {
		err := cl.Ping(ctx)
		ae := authErr(sec, brokers, err)
		switch {
		case err == nil || !errors.Is(ae, ErrKafkaAuth):
			return nil // other errors: left to the caller's retries
		case !mismatch(err) || attempt == 3:
			return ae
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// mismatch reports whether err is franz-go's guess that the client and the
// brokers disagree about TLS or SASL (the broker closed the connection at
// once, or answered a plain-text request with a TLS alert).
func mismatch(err error) bool {
	var fe *kgo.ErrFirstReadEOF
	return errors.As(err, &fe) || strings.Contains(err.Error(), "is this a plaintext connection speaking to a tls endpoint")
}

// Doctor connects to the brokers once with cfg's security (no topic is
// created, the transactional id is not touched) and reports how: TLS mode
// and CA, SASL mechanism and user. A refused login or certificate, or no
// answer, is a failed check naming the brokers; plain text to brokers off
// the host is a warning.
func Doctor(ctx context.Context, cfg Config) tidemark.Check {
	cfg = cfg.withDefaults()
	c := tidemark.Check{Name: "target kafka", Status: tidemark.CheckOK}
	brokers := strings.Join(cfg.Brokers, ",")
	sec, err := cfg.Security.opts()
	if err != nil {
		c.Status, c.Found, c.Fix = tidemark.CheckFix, err.Error(), "fix target.kafka"
		return c
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID(cfg.ClientID)}, sec...)...)
	if err != nil {
		c.Status, c.Found, c.Fix = tidemark.CheckFix, err.Error(), "fix target.kafka.brokers"
		return c
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		c.Status, c.Found = tidemark.CheckFix, authErr(cfg.Security, cfg.Brokers, err).Error()
		c.Fix = "make the brokers reachable with target.kafka.brokers, tls and sasl"
		return c
	}
	how := "plain text"
	if t := cfg.Security.TLS; t != nil {
		ca := t.CAFile
		if ca == "" {
			ca = "the system's roots"
		}
		how = "TLS " + t.Mode + " (CA " + ca + ")"
		if !t.Verified() {
			how = "TLS " + t.Mode + ", certificate not verified"
			c.Status, c.Fix = tidemark.CheckWarn, "set target.kafka.tls.ca_file and mode verify-full so that a broker in the middle is detected"
		}
	} else if !allLoopback(cfg.Brokers) {
		c.Status, c.Fix = tidemark.CheckWarn, "set target.kafka.tls: every change crosses the network in plain text"
	}
	if a := cfg.Security.SASL; a != nil {
		how += ", SASL " + a.Mechanism + " as " + a.User
	} else {
		how += ", no SASL"
	}
	c.Found = brokers + ": " + how
	return c
}

func allLoopback(brokers []string) bool {
	for _, b := range brokers {
		if !tidemark.IsLoopback(b) {
			return false
		}
	}
	return true
}
