// Package workload is the demo's workload on the local services
// (scripts/services.sh): their connection settings, the orders table with
// the IST incident row, and a reproducible mix of transactions. `tidemark
// demo`, the bench command and the integration tests share it; the daemon
// does not use it.
package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/go-mysql-org/go-mysql/client"
	"github.com/go-mysql-org/go-mysql/mysql"

	"tidemark"
)

// OrdersDDL creates the demo table: a composite business key, an exact
// amount, and an updated_at DATETIME written in the source zone (IST in the
// demo).
const OrdersDDL = `CREATE TABLE orders (
	order_id BIGINT NOT NULL,
	line_item_id INT NOT NULL,
	customer VARCHAR(64) NOT NULL,
	amount DECIMAL(12,2) NOT NULL,
	status ENUM('new','paid','shipped','cancelled') NOT NULL,
	note TEXT,
	updated_at DATETIME(6) NOT NULL,
	paid_at TIMESTAMP(6) NULL,
	PRIMARY KEY (order_id, line_item_id)
) DEFAULT CHARSET=utf8mb4`

// Exec runs statements on the source, stopping at the first error.
func Exec(my *client.Conn, sqls ...string) error {
	for _, q := range sqls {
		if _, err := my.Execute(q); err != nil {
			return fmt.Errorf("exec %.80q: %w", q, err)
		}
	}
	return nil
}

// Stats counts what a workload did.
type Stats struct {
	Transactions, Inserts, Updates, Deletes int
}

// Workload writes a mixed, reproducible workload into db.orders: single-row
// and 1000-row insert transactions, updates, deletes and a hot key updated
// over and over. Session time_zone is the source zone, so NOW(6) stored in
// the DATETIME is local time, as in the incident.
type Workload struct {
	My       *client.Conn
	Database string
	Zone     string // session time_zone, e.g. Asia/Kolkata
	Rand     *rand.Rand
	// BigTxRows is the size of a bulk insert transaction (default 1000).
	BigTxRows int

	nextOrder int64
	keys      [][2]int64
	Stats     Stats
}

// Setup creates the database (dropping an old one), the table, and the IST
// incident row: updated_at '2026-03-10 23:58:00' in the source zone.
func (w *Workload) Setup() error {
	if w.BigTxRows == 0 {
		w.BigTxRows = 1000
	}
	if w.Rand == nil {
		w.Rand = rand.New(rand.NewPCG(1, 2))
	}
	db := tidemark.QuoteMySQL(w.Database)
	if err := Exec(w.My, "DROP DATABASE IF EXISTS "+db, "CREATE DATABASE "+db, "USE "+db, OrdersDDL); err != nil {
		return err
	}
	if err := w.session(); err != nil {
		return err
	}
	// Order 0 is the incident row (never touched again); order 1 is the
	// hot key.
	err := Exec(w.My, "INSERT INTO orders VALUES (0, 1, 'incident', 1999.00, 'paid', 'the IST row', '2026-03-10 23:58:00', '2026-03-10 18:28:00'),"+
		" (1, 1, 'hot', 10.00, 'new', 'hot key', NOW(6), NULL)")
	w.keys = append(w.keys, [2]int64{1, 1})
	w.nextOrder = 2
	w.Stats.Transactions++
	w.Stats.Inserts += 2
	return err
}

func (w *Workload) session() error {
	return Exec(w.My, "USE "+tidemark.QuoteMySQL(w.Database), fmt.Sprintf("SET time_zone = '%s'", strings.ReplaceAll(w.Zone, "'", "")))
}

// Resume re-selects the session settings after a reconnect.
func (w *Workload) Resume() error { return w.session() }

func (w *Workload) insertValues(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		o := w.nextOrder
		li := int64(1 + w.Rand.IntN(3))
		w.nextOrder++
		w.keys = append(w.keys, [2]int64{o, li})
		// updated_at is the modification time (what a watermark column
		// means); the microseconds are what NOW(6) gives.
		fmt.Fprintf(&b, "(%d, %d, 'cust-%d', %d.%02d, 'new', %s, NOW(6), NULL)",
			o, li, w.Rand.IntN(500), w.Rand.IntN(10000), w.Rand.IntN(100), noteFor(w.Rand))
	}
	return b.String()
}

func noteFor(r *rand.Rand) string {
	switch r.IntN(4) {
	case 0:
		return "NULL"
	case 1:
		return "'héllo wörld 🐳'"
	default:
		return fmt.Sprintf("'note %d'", r.IntN(1000))
	}
}

// Step runs one random transaction.
func (w *Workload) Step() error {
	r := w.Rand.IntN(100)
	var err error
	switch {
	case r < 35:
		err = Exec(w.My, "INSERT INTO orders VALUES "+w.insertValues(1))
		w.Stats.Inserts++
	case r < 38:
		err = Exec(w.My, "INSERT INTO orders VALUES "+w.insertValues(w.BigTxRows))
		w.Stats.Inserts += w.BigTxRows
	case r < 60:
		k := w.pick()
		err = Exec(w.My, fmt.Sprintf("UPDATE orders SET amount = amount + %d.%02d, status = ELT(1 + FLOOR(RAND()*3), 'new','paid','shipped'), paid_at = IF(paid_at IS NULL, NOW(6), paid_at), updated_at = NOW(6) WHERE order_id = %d AND line_item_id = %d",
			w.Rand.IntN(50), w.Rand.IntN(100), k[0], k[1]))
		w.Stats.Updates++
	case r < 75:
		// The hot key: updated many times in a row, sometimes in one
		// transaction.
		err = Exec(w.My, "BEGIN",
			"UPDATE orders SET amount = amount + 1, updated_at = NOW(6) WHERE order_id = 1 AND line_item_id = 1",
			"UPDATE orders SET amount = amount - 1, note = CONCAT('hot ', "+fmt.Sprint(w.Rand.IntN(1000))+") WHERE order_id = 1 AND line_item_id = 1",
			"COMMIT")
		w.Stats.Updates += 2
	case r < 85:
		k := w.pick()
		if k[0] <= 1 {
			k = [2]int64{w.nextOrder - 1, 1}
		}
		err = Exec(w.My, fmt.Sprintf("DELETE FROM orders WHERE order_id = %d AND line_item_id = %d", k[0], k[1]))
		w.Stats.Deletes++
	case r < 90:
		// A multi-statement transaction: insert, update it, delete another.
		vals := w.insertValues(1)
		k := w.keys[len(w.keys)-1]
		d := w.pick()
		if d[0] <= 1 {
			d = k
		}
		err = Exec(w.My, "BEGIN", "INSERT INTO orders VALUES "+vals,
			fmt.Sprintf("UPDATE orders SET status = 'paid', amount = amount * 2 WHERE order_id = %d AND line_item_id = %d", k[0], k[1]),
			fmt.Sprintf("DELETE FROM orders WHERE order_id = %d AND line_item_id = %d", d[0], d[1]), "COMMIT")
		w.Stats.Inserts++
		w.Stats.Updates++
		w.Stats.Deletes++
	default:
		// Update many rows in one statement.
		lo := 1 + w.Rand.Int64N(w.nextOrder)
		err = Exec(w.My, fmt.Sprintf("UPDATE orders SET status = 'shipped', updated_at = NOW(6) WHERE order_id BETWEEN %d AND %d AND status = 'paid'", lo, lo+200))
		w.Stats.Updates++
	}
	w.Stats.Transactions++
	return err
}

func (w *Workload) pick() [2]int64 {
	if len(w.keys) == 0 {
		return [2]int64{1, 1}
	}
	return w.keys[w.Rand.IntN(len(w.keys))]
}

// Run runs n steps.
func (w *Workload) Run(n int) error {
	for i := 0; i < n; i++ {
		if err := w.Step(); err != nil {
			return err
		}
	}
	return nil
}

// SourcePosition returns the source's current GTID position.
func SourcePosition(my *client.Conn) (tidemark.Position, error) {
	r, err := my.Execute("SELECT @@gtid_binlog_pos")
	if err != nil {
		// MySQL: no gtid_binlog_pos; its GTID set is gtid_executed
		// (printed with a newline after each comma).
		var me *mysql.MyError
		if !errors.As(err, &me) || me.Code != mysql.ER_UNKNOWN_SYSTEM_VARIABLE {
			return tidemark.Position{}, fmt.Errorf("read gtid_binlog_pos: %w", err)
		}
		if r, err = my.Execute("SELECT @@gtid_executed"); err != nil {
			return tidemark.Position{}, fmt.Errorf("read gtid_executed: %w", err)
		}
		s, _ := r.GetString(0, 0)
		return tidemark.Position{GTID: strings.ReplaceAll(s, "\n", "")}, nil
	}
	s, _ := r.GetString(0, 0)
	return tidemark.Position{GTID: s}, nil
}
