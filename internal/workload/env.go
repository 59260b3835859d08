package workload

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/jackc/pgx/v5"
)

// Env is the connection settings of the local services (scripts/services.sh
// env).
type Env struct {
	MySQLAddr, MySQLUser, MySQLPassword string
	// Flavor is the source's binlog flavor: "mariadb" (the MariaDB of
	// TIDEMARK_TEST_MYSQL_*) or "mysql" (the real MySQL 9.7 of
	// TIDEMARK_TEST_MYSQL9_*, see MySQL9).
	Flavor string
	// MySQL9Addr, MySQL9User and MySQL9Password are the real MySQL 9.7
	// (TIDEMARK_TEST_MYSQL9_*); MySQL9Root is the Debian-unstable root it
	// runs from (TIDEMARK_TEST_MYSQL9_ROOT), for tests that start a second
	// mysqld.
	MySQL9Addr, MySQL9User, MySQL9Password, MySQL9Root string
	PGDSN                                              string
	// KafkaBrokers are the seed brokers of the local Apache Kafka broker
	// (TIDEMARK_TEST_KAFKA_BROKERS, comma-separated); see KafkaOrError.
	KafkaBrokers []string
}

// EnvFromOS reads the TIDEMARK_TEST_* variables; it fails when they are not
// set, naming the command that sets them.
func EnvFromOS() (Env, error) {
	e := Env{
		MySQLAddr: os.Getenv("TIDEMARK_TEST_MYSQL_ADDR"), MySQLUser: os.Getenv("TIDEMARK_TEST_MYSQL_USER"),
		MySQLPassword: os.Getenv("TIDEMARK_TEST_MYSQL_PASSWORD"), PGDSN: os.Getenv("TIDEMARK_TEST_PG_DSN"),
		Flavor:     "mariadb",
		MySQL9Addr: os.Getenv("TIDEMARK_TEST_MYSQL9_ADDR"), MySQL9User: os.Getenv("TIDEMARK_TEST_MYSQL9_USER"),
		MySQL9Password: os.Getenv("TIDEMARK_TEST_MYSQL9_PASSWORD"), MySQL9Root: os.Getenv("TIDEMARK_TEST_MYSQL9_ROOT"),
	}
	for _, b := range strings.Split(os.Getenv("TIDEMARK_TEST_KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			e.KafkaBrokers = append(e.KafkaBrokers, b)
		}
	}
	if e.MySQLAddr == "" || e.PGDSN == "" {
		return e, fmt.Errorf("TIDEMARK_TEST_MYSQL_ADDR / TIDEMARK_TEST_PG_DSN are not set: run `scripts/services.sh up` and `eval \"$(scripts/services.sh env)\"` (make test and make demo do both)")
	}
	return e, nil
}

// Kafka returns the seed brokers of the real Kafka broker, or an error
// naming the variable and the command that starts it when it is not set.
func (e Env) Kafka() ([]string, error) {
	if len(e.KafkaBrokers) == 0 {
		return nil, fmt.Errorf("TIDEMARK_TEST_KAFKA_BROKERS is not set: run `scripts/services.sh up` (it starts Apache Kafka) and `eval \"$(scripts/services.sh env)\"` (make test does both)")
	}
	return e.KafkaBrokers, nil
}

// MySQL9 returns the settings with the real MySQL 9.7 as the source
// (Flavor "mysql"), or an error naming the variable and the command that
// starts it when it is not set.
func (e Env) MySQL9() (Env, error) {
	if e.MySQL9Addr == "" {
		return e, fmt.Errorf("TIDEMARK_TEST_MYSQL9_ADDR is not set: run `scripts/services.sh up` (it starts the real MySQL 9.7) and `eval \"$(scripts/services.sh env)\"` (make test does both)")
	}
	e.MySQLAddr, e.MySQLUser, e.MySQLPassword, e.Flavor = e.MySQL9Addr, e.MySQL9User, e.MySQL9Password, "mysql"
	return e, nil
}

// ServerName is the source server's name for messages.
func (e Env) ServerName() string {
	if e.Flavor == "mysql" {
		return "MySQL"
	}
	return "MariaDB"
}

// MySQL opens a source connection.
func (e Env) MySQL() (*client.Conn, error) {
	c, err := client.Connect(e.MySQLAddr, e.MySQLUser, e.MySQLPassword, "")
	if err != nil {
		return nil, fmt.Errorf("connect to %s at %s: %w", e.ServerName(), e.MySQLAddr, err)
	}
	return c, nil
}

// PG opens a target connection.
func (e Env) PG(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, e.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return c, nil
}
