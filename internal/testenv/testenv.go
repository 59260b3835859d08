// Package testenv is the one test environment of tidemark's tests: the
// addresses of the local servers that scripts/services.sh starts (read from
// the TIDEMARK_TEST_* variables that `scripts/services.sh env` prints),
// random names that are cleaned up, polling, and a typed builder for daemon
// configs (Daemon).
//
// It is test support only: _test.go files and integration/harness import
// it, the tidemark binary must not link it (cmd/tidemark's
// TestBinaryLinksNoTestCode checks), and it imports no tidemark package, so
// that every package's tests, the root's included, can use it.
//
// A test that needs a server fails, never skips, when its variables are
// not set (DEVELOPERS.md: a skipped database test cannot fail), with one
// message naming the variable and the command that sets it.
package testenv

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"
)

// setup is what a missing variable's message tells the reader to run.
const setup = "run `scripts/services.sh up` and `eval \"$(scripts/services.sh env)\"` (make test does both)"

// need returns the values of the variables, failing t, with one message
// naming the first variable that is not set, when one is not.
func need(t testing.TB, what string, names ...string) []string {
	t.Helper()
	vals := make([]string, len(names))
	for i, n := range names {
		vals[i] = os.Getenv(n)
		if vals[i] == "" {
			ci := ""
			if os.Getenv("CI") == "true" {
				ci = " (CI=true: CI starts every server, so this is a failure, not a skip)"
			}
			t.Fatalf("%s: %s is not set: %s%s", what, n, setup, ci)
		}
	}
	return vals
}

// Server is a MySQL-protocol source server and the tidemark test account on
// it.
type Server struct {
	Addr, User, Password string
	// Flavor is the binlog flavor: "mariadb" or "mysql".
	Flavor string
}

// MySQL is the MariaDB 10.11 source (TIDEMARK_TEST_MYSQL_*).
func MySQL(t testing.TB) Server {
	t.Helper()
	v := need(t, "the test MariaDB", "TIDEMARK_TEST_MYSQL_ADDR", "TIDEMARK_TEST_MYSQL_USER")
	return Server{Addr: v[0], User: v[1], Password: os.Getenv("TIDEMARK_TEST_MYSQL_PASSWORD"), Flavor: "mariadb"}
}

// MySQL9 is the real MySQL 9.7 source (TIDEMARK_TEST_MYSQL9_*).
func MySQL9(t testing.TB) Server {
	t.Helper()
	v := need(t, "the test MySQL 9.7", "TIDEMARK_TEST_MYSQL9_ADDR", "TIDEMARK_TEST_MYSQL9_USER")
	return Server{Addr: v[0], User: v[1], Password: os.Getenv("TIDEMARK_TEST_MYSQL9_PASSWORD"), Flavor: "mysql"}
}

// MySQL9CA is the CA file of the MySQL 9.7 server's auto-generated
// certificate (TIDEMARK_TEST_MYSQL9_CA).
func MySQL9CA(t testing.TB) string {
	t.Helper()
	return need(t, "the test MySQL 9.7's CA", "TIDEMARK_TEST_MYSQL9_CA")[0]
}

// MySQL9Root is the root directory the MySQL 9.7 binaries run from
// (TIDEMARK_TEST_MYSQL9_ROOT), for tests that start a second mysqld.
func MySQL9Root(t testing.TB) string {
	t.Helper()
	return need(t, "the MySQL 9.7 installation", "TIDEMARK_TEST_MYSQL9_ROOT")[0]
}

// PG is the DSN of the PostgreSQL 15 target (TIDEMARK_TEST_PG_DSN).
func PG(t testing.TB) string {
	t.Helper()
	return need(t, "the test PostgreSQL", "TIDEMARK_TEST_PG_DSN")[0]
}

// Kafka is the seed brokers of the real Apache Kafka broker
// (TIDEMARK_TEST_KAFKA_BROKERS, comma-separated).
func Kafka(t testing.TB) []string {
	t.Helper()
	return splitList(need(t, "the test Kafka broker", "TIDEMARK_TEST_KAFKA_BROKERS")[0])
}

// HasKafka reports whether the Kafka broker's variable is set, for code
// that decides whether a Kafka topology can be drawn at all.
func HasKafka() bool { return len(splitList(os.Getenv("TIDEMARK_TEST_KAFKA_BROKERS"))) > 0 }

func splitList(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// TLSEnv is the TLS side of the local servers: the CA of their
// certificates and the accounts that accept TLS connections only.
type TLSEnv struct {
	CA                   string
	MySQLUser, MySQLPass string
	PGDSN                string // the TLS-only role, sslmode=verify-full with the CA
	KafkaSASL, KafkaSSL  string // brokers of the SASL_SSL and SSL listeners
	KafkaUser, KafkaPass string
}

// TLS is the TLS side of the local servers (TIDEMARK_TEST_TLS_CA and the
// TLS-only accounts).
func TLS(t testing.TB) TLSEnv {
	t.Helper()
	v := need(t, "the servers' TLS setup", "TIDEMARK_TEST_TLS_CA", "TIDEMARK_TEST_MYSQL_TLS_USER", "TIDEMARK_TEST_PG_TLS_DSN")
	return TLSEnv{CA: v[0], MySQLUser: v[1], MySQLPass: os.Getenv("TIDEMARK_TEST_MYSQL_TLS_PASSWORD"), PGDSN: v[2],
		KafkaSASL: os.Getenv("TIDEMARK_TEST_KAFKA_SASL_BROKERS"), KafkaSSL: os.Getenv("TIDEMARK_TEST_KAFKA_SSL_BROKERS"),
		KafkaUser: os.Getenv("TIDEMARK_TEST_KAFKA_SASL_USER"), KafkaPass: os.Getenv("TIDEMARK_TEST_KAFKA_SASL_PASSWORD")}
}

// KafkaTLS is TLS with the Kafka listeners required as well.
func KafkaTLS(t testing.TB) TLSEnv {
	t.Helper()
	e := TLS(t)
	need(t, "the Kafka broker's TLS listeners", "TIDEMARK_TEST_KAFKA_SASL_BROKERS", "TIDEMARK_TEST_KAFKA_SSL_BROKERS", "TIDEMARK_TEST_KAFKA_SASL_USER")
	return e
}

// Artifacts is the directory for files a test leaves for a person to look
// at (TIDEMARK_TEST_ARTIFACTS), or "" when it is not set.
func Artifacts() string { return os.Getenv("TIDEMARK_TEST_ARTIFACTS") }

// Verbose reports whether TIDEMARK_TEST_LOG asks for the components' log
// lines.
func Verbose() bool { return os.Getenv("TIDEMARK_TEST_LOG") != "" }

// Name returns prefix followed by 8 random hex digits: a database, schema,
// topic or source name unique to this test run. Lower case, so valid
// unquoted in MySQL and PostgreSQL.
func Name(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// ServerID returns a random replication server_id in [1<<20, 1<<31):
// tests of different packages run at the same time against one source,
// and two replication connections with one server_id make the server drop
// the older one.
func ServerID() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 1<<20 + binary.LittleEndian.Uint32(b[:])%(1<<31-1<<20)
}

// WaitFor polls cond until it is true (true) or timeout passes (false).
// The pause between polls starts at 5 ms and doubles up to 100 ms: quick
// for in-process conditions, light for ones that query a server.
func WaitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// Eventually is WaitFor that fails t, naming what it waited for, when the
// timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !WaitFor(timeout, cond) {
		t.Fatalf("%s: not within %s", what, timeout)
	}
}
