package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"tidemark"
	"tidemark/integration/harness"
	"tidemark/internal/testcerts"
	"tidemark/internal/testenv"
	"tidemark/sink/kafka"
)

// ensureSCRAMUser gives the SASL user SCRAM-SHA-256 and -512 credentials
// (scripts/services.sh adds them when it formats the broker's storage; a
// storage formatted before that gets them here, through the broker's own
// AlterUserScramCredentials on the plain-text listener).
func ensureSCRAMUser(t *testing.T, plainBrokers []string, user, pass string) {
	t.Helper()
	adm := kadmClient(t, plainBrokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One mechanism per request: the broker refuses two for one user.
	for _, m := range []kadm.ScramMechanism{kadm.ScramSha256, kadm.ScramSha512} {
		res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: user, Mechanism: m, Iterations: 4096, Password: pass}})
		if err == nil {
			err = res.Error()
		}
		if err != nil {
			t.Fatalf("upsert the SCRAM user %s (%s): %v", user, m, err)
		}
	}
}

func tlsBatch(db string, seq uint64) *tidemark.Batch {
	tbl := &tidemark.Table{ID: tidemark.TableID{Database: db, Name: "t"},
		Columns: []tidemark.Column{{Name: "id", Kind: tidemark.KindInt, Bits: 32}, {Name: "v", Kind: tidemark.KindText, Nullable: true}}, Key: []int{0}}
	return &tidemark.Batch{Source: db, Checkpoint: tidemark.Position{GTID: "0-1-" + strconv.FormatUint(seq, 10)},
		Changes: []tidemark.Change{{Table: tbl, Op: tidemark.OpInsert, Version: tidemark.Version{Seq: seq, Index: 1},
			CommitTime: time.Now().UTC().Truncate(time.Second), After: []any{int64(seq), "sasl canary row"}, Size: 50}}}
}

// TestKafkaTLSAndSASL opens the Kafka sink (exactly once, the real broker)
// through its SASL_SSL listener with each mechanism (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512, the broker's CA, verify-full) and through its SSL listener
// without SASL: a batch is published and its checkpoint read back from the
// checkpoint topic; GroupStatus (the admin client of `tidemark status`)
// connects the same way. A wrong password stops Open at once with an error
// naming the brokers, the mechanism and the user, never the password, and
// no retries; a CA that did not sign the broker's certificate stops it with
// an error naming the brokers and the certificate.
func TestKafkaTLSAndSASL(t *testing.T) {
	f := newFixture(t)
	te := tlsEnvFromOS(t)
	plain := f.kafka(t)
	ensureSCRAMUser(t, plain, te.KafkaUser, te.KafkaPass)
	sasl := strings.Split(te.KafkaSASL, ",")
	ssl := strings.Split(te.KafkaSSL, ",")
	caTLS := &tidemark.TLSConfig{CAFile: te.CA}
	open := func(t *testing.T, brokers []string, sec kafka.Security, logs *lockedWriter) (*kafka.Sink, kafka.Config, error) {
		t.Helper()
		db := testenv.Name("tls_k_")
		lw := logs
		if lw == nil {
			lw = &lockedWriter{}
		}
		cfg := kafka.Config{Brokers: brokers, Security: sec, TopicPrefix: "tk" + db, CreateTopics: true, ExactlyOnce: true,
			TransactionalID: "txn-" + db, Logger: slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: slog.LevelDebug}))}
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		s, err := kafka.Open(ctx, cfg)
		return s, cfg, err
	}
	for _, tc := range []struct {
		name    string
		brokers []string
		sec     kafka.Security
	}{
		{"PLAINTEXT", plain, kafka.Security{}},
		{"SASL_SSL PLAIN", sasl, kafka.Security{TLS: caTLS, SASL: &kafka.SASLConfig{Mechanism: "PLAIN", User: te.KafkaUser, Password: te.KafkaPass}}},
		{"SASL_SSL SCRAM-SHA-256", sasl, kafka.Security{TLS: caTLS, SASL: &kafka.SASLConfig{Mechanism: "SCRAM-SHA-256", User: te.KafkaUser, Password: te.KafkaPass}}},
		{"SASL_SSL SCRAM-SHA-512", sasl, kafka.Security{TLS: caTLS, SASL: &kafka.SASLConfig{Mechanism: "SCRAM-SHA-512", User: te.KafkaUser, Password: te.KafkaPass}}},
		{"SSL verify-ca", ssl, kafka.Security{TLS: &tidemark.TLSConfig{Mode: "verify-ca", CAFile: te.CA, ServerName: "wrong.example"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedWriter{}
			defer func() {
				if t.Failed() {
					t.Logf("sink log:\n%s", tail(logs.String(), 30))
				}
			}()
			s, cfg, err := open(t, tc.brokers, tc.sec, logs)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			b := tlsBatch(strings.TrimPrefix(cfg.TopicPrefix, "tk"), 7)
			if _, err := s.Apply(ctx, b); err != nil {
				t.Fatalf("apply: %v", err)
			}
			// Read back at once through the checkpoint reader's own client.
			if pos, ok, err := s.Checkpoint(ctx, b.Source); err != nil || !ok || pos.GTID != b.Checkpoint.GTID {
				t.Fatalf("checkpoint read back: %v %v %v", pos, ok, err)
			}
			// The admin client of `tidemark status` (a group that does not
			// exist yet: its coordinator may take a moment).
			if !testenv.WaitFor(20*time.Second, func() bool {
				_, err = kafka.GroupStatus(ctx, kafka.ApplierConfig{Brokers: tc.brokers, Security: tc.sec, Group: "g-" + b.Source, Topics: "^" + cfg.TopicPrefix + `\.`})
				return err == nil || errors.Is(err, kafka.ErrKafkaAuth)
			}) {
				t.Fatalf("group status: %v", err)
			}
		})
	}

	other, err := testcerts.NewCA(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	const wrongPassword = "wrong-sasl-canary-password"
	for _, tc := range []struct {
		name    string
		brokers []string
		sec     kafka.Security
		want    []string
	}{
		{"wrong SCRAM password", sasl, kafka.Security{TLS: caTLS, SASL: &kafka.SASLConfig{Mechanism: "SCRAM-SHA-512", User: te.KafkaUser, Password: wrongPassword}},
			[]string{"kafka brokers " + te.KafkaSASL + " refused the SASL login (SCRAM-SHA-512 as " + te.KafkaUser + ")", "SASL_AUTHENTICATION_FAILED"}},
		{"wrong PLAIN password", sasl, kafka.Security{TLS: caTLS, SASL: &kafka.SASLConfig{Mechanism: "PLAIN", User: te.KafkaUser, Password: wrongPassword}},
			[]string{"refused the SASL login (PLAIN as " + te.KafkaUser + ")"}},
		{"TLS to the plain-text listener", plain, kafka.Security{TLS: caTLS},
			[]string{"kafka brokers " + plain[0] + " and target.kafka disagree about TLS or SASL (tls set, sasl not set)", "is TLS misconfigured"}},
		{"plain text to the SASL_SSL listener", sasl, kafka.Security{},
			[]string{"kafka brokers " + te.KafkaSASL + " and target.kafka disagree about TLS or SASL (tls not set, sasl not set)", "plaintext connection speaking to a tls endpoint"}},
		{"no SASL on the SASL_SSL listener", sasl, kafka.Security{TLS: caTLS},
			[]string{"kafka brokers " + te.KafkaSASL + " and target.kafka disagree about TLS or SASL (tls set, sasl not set)", "is SASL missing"}},
		{"another CA", sasl, kafka.Security{TLS: &tidemark.TLSConfig{CAFile: other.File}, SASL: &kafka.SASLConfig{Mechanism: "SCRAM-SHA-512", User: te.KafkaUser, Password: te.KafkaPass}},
			[]string{"kafka brokers " + te.KafkaSASL + ": TLS certificate not verified (tls mode verify-full", "certificate signed by unknown authority"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedWriter{}
			start := time.Now()
			s, _, err := open(t, tc.brokers, tc.sec, logs)
			took := time.Since(start)
			if err == nil {
				s.Close()
				t.Fatal("open: no error")
			}
			t.Logf("open failed after %s: %v", took.Round(time.Millisecond), err)
			if !errors.Is(err, kafka.ErrKafkaAuth) {
				t.Errorf("error is not kafka.ErrKafkaAuth: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if took > 10*time.Second {
				t.Errorf("open took %s to fail: it retried an error no retry heals", took)
			}
			if n := strings.Count(logs.String(), "retrying"); n > 0 {
				t.Errorf("%d retries logged:\n%s", n, logs.String())
			}
			if strings.Contains(err.Error()+logs.String(), wrongPassword) || strings.Contains(err.Error()+logs.String(), te.KafkaPass) {
				t.Errorf("a password was printed")
			}
		})
	}
}

// secureConfig turns a config written by newKafkaRun into one that uses
// TLS everywhere: the source through its TLS-only account (source.tls with
// the CA, password_file), PostgreSQL through its hostssl-only role
// (verify-full, dsn_file), Kafka through the SASL_SSL listener (tls with
// the CA, sasl SCRAM-SHA-512 with password_file, the password given).
func secureConfig(t *testing.T, te tlsEnv, cfg, kafkaPassword string) {
	t.Helper()
	setSourceOption(t, cfg, "user", te.MySQLUser)
	setSourceOption(t, cfg, "password", "")
	setSourceOption(t, cfg, "password_file", writeSecret(t, "mysql-password", te.MySQLPass))
	setSourceOption(t, cfg, "tls", "{ca_file: "+te.CA+"}")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(b), "  password: \n", "", 1)
	y = strings.Replace(y, "    dsn: ${TM_IT_PG_DSN}", "    dsn_file: "+writeSecret(t, "pg-dsn", te.PGDSN), 1)
	y = regexp.MustCompile(`    brokers: \[.*\]`).ReplaceAllLiteralString(y, fmt.Sprintf(`    brokers: [%s]
    tls: {ca_file: %s}
    sasl: {mechanism: SCRAM-SHA-512, user: %s, password_file: %s}`, te.KafkaSASL, te.CA, te.KafkaUser, writeSecret(t, "kafka-password", kafkaPassword)))
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLSApplyTopology runs the scale-out topology with every connection
// secured (secureConfig): the tailer streams the source over TLS into
// Kafka over SASL_SSL (exactly once, its checkpoint topic too), an applier
// consumes over SASL_SSL and writes PostgreSQL over TLS until the target
// equals the source; `status` (the group's admin client) and `doctor` go
// through the same connections. With a wrong SASL password the tailer and
// the applier stop at once with an error naming the brokers, mechanism and
// user; no password is ever printed.
func TestTLSApplyTopology(t *testing.T) {
	f := newFixture(t)
	te := tlsEnvFromOS(t)
	ensureSCRAMUser(t, f.kafka(t), te.KafkaUser, te.KafkaPass)
	r, group := f.newApplyRun(t, "it_tlsap_", 26, 2, 200)
	secureConfig(t, te, r.cfg, te.KafkaPass)
	ps := &procSet{f: f, t: t}
	defer ps.killAll()
	tailer := ps.start("run", "--config", r.cfg)
	applier := ps.start("apply", "--config", r.cfg)
	if err := r.w.Run(40); err != nil {
		t.Fatal(err)
	}
	spec := harness.TableSpec{Database: r.db, Table: "orders", SourceZone: "UTC"}
	var diff *harness.Diff
	if !testenv.WaitFor(120*time.Second, func() bool {
		d, err := harness.Compare(f.ctx, f.my, f.pg, spec)
		diff = d
		return err == nil && d.Equal()
	}) {
		t.Fatalf("target did not converge: %v\ntailer:\n%s\napplier:\n%s", diff, tail(tailer.stderr.String(), 20), tail(applier.stderr.String(), 20))
	}
	code, status := runBinary(t, time.Minute, nil, "status", "--config", r.cfg, "--json")
	if code != 0 || !strings.Contains(status, `"group":"`+group+`"`) && !strings.Contains(status, `"group": "`+group+`"`) {
		t.Fatalf("status over SASL_SSL: exit %d:\n%s", code, status)
	}
	code, doctor := runBinary(t, time.Minute, nil, "doctor", "--config", r.cfg)
	if !hasCheck(doctor, "ok", "source TLS", "certificate verified") || !hasCheck(doctor, "ok", "target TLS", "certificate verified") ||
		!hasCheck(doctor, "ok", "target kafka", te.KafkaSASL+": TLS verify-full (CA "+te.CA+"), SASL SCRAM-SHA-512 as "+te.KafkaUser) {
		t.Fatalf("doctor: exit %d:\n%s", code, doctor)
	}
	for _, d := range []*daemonProc{applier, tailer} {
		if c := d.stop(t); c != 0 {
			t.Fatalf("exit %d:\n%s", c, tail(d.stderr.String(), 20))
		}
	}
	all := tailer.stderr.String() + applier.stderr.String() + status + doctor

	// A wrong SASL password: both stop at once, naming what was refused.
	const wrong = "wrong-kafka-canary-password"
	bad := strings.Replace(r.cfg, ".yaml", "-wrong.yaml", 1)
	copyFile(t, r.cfg, bad)
	b, _ := os.ReadFile(bad)
	y := regexp.MustCompile(`password_file: [^}]*kafka-password`).ReplaceAllLiteralString(string(b), "password_file: "+writeSecret(t, "wrong-kafka-password", wrong))
	if err := os.WriteFile(bad, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"run", "apply"} {
		start := time.Now()
		code, out := runBinary(t, time.Minute, nil, cmd, "--config", bad)
		took := time.Since(start)
		if code == 0 || !strings.Contains(out, "refused the SASL login (SCRAM-SHA-512 as "+te.KafkaUser+")") || took > 20*time.Second {
			t.Fatalf("%s with a wrong SASL password: exit %d after %s, want a stop naming the login:\n%s", cmd, code, took, tail(out, 20))
		}
		if n := strings.Count(out, "SASL_AUTHENTICATION_FAILED"); n > 3 {
			t.Errorf("%s: %d SASL failures logged (a retry storm?):\n%s", cmd, n, tail(out, 20))
		}
		all += out
	}
	for _, secret := range []string{te.KafkaPass, wrong, te.MySQLPass, "tidemark-tls-local"} {
		if strings.Contains(all, secret) {
			t.Fatalf("a password was printed (%d bytes of output searched)", len(all))
		}
	}
}
