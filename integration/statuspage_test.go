package integration

import (
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"tidemark/integration/harness"
	"tidemark/internal/testenv"
)

// The status page in a real browser: Debian's chromium, headless, loads
// http://<metrics listener>/ while a workload runs and after it; the figures
// the browser shows are checked against the databases (target row counts,
// the checkpoint row, the table states, the stored verify run), and a
// screenshot is kept (bin/test-artifacts/status-page.png, or
// $TIDEMARK_TEST_ARTIFACTS).

// chromiumFlags keep a headless chromium off the network (the machine has
// none: without them it waits on it).
var chromiumFlags = []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-default-apps",
	"--hide-scrollbars", "--window-size=1280,1250"}

// chromium runs headless chromium with a fresh profile and returns its
// stdout.
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (scripts/services.sh up installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append(append(append([]string{}, chromiumFlags...), "--user-data-dir="+t.TempDir()), args...)
	cmd := exec.CommandContext(ctx, bin, all...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// pageField returns the text of the element with id in a dumped DOM.
func pageField(dom, id string) string {
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*>(?:<b>)?([^<]*)`).FindStringSubmatch(dom)
	if m == nil {
		return ""
	}
	return html.UnescapeString(strings.TrimSpace(m[1]))
}

// pageTable returns the mode and reason the page shows for a table.
func pageTable(dom, table string) (mode, reason string) {
	m := regexp.MustCompile(`<tr data-table="` + regexp.QuoteMeta(table) + `">.*?data-mode="([^"]*)".*?<td data-reason="">([^<]*)</td>`).FindStringSubmatch(dom)
	if m == nil {
		return "", ""
	}
	return m[1], html.UnescapeString(m[2])
}

func artifactDir(t *testing.T) string {
	dir := testenv.Artifacts()
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "bin", "test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestStatusPageInBrowser(t *testing.T) {
	f := newFixture(t)
	db := testenv.Name("it_page_")
	f.dropLater(t, db, db)
	f.forgetStates(t, db)
	t.Cleanup(func() { _, _ = f.pg.Exec(f.ctx, "DELETE FROM tidemark.verify_runs WHERE source = $1", db) })
	start, err := harness.SourcePosition(f.my)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE DATABASE "+db, "USE "+db,
		"CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL, KEY kv (v))",
		"CREATE TABLE q (id INT PRIMARY KEY, v INT)",
		"INSERT INTO q VALUES (1, 1), (2, 2)")
	addr := freePort(t)
	cfg := f.configYAMLWith(t, db, db, db, "UTC", start, fmt.Sprintf("metrics:\n  listen: %s\n", addr))
	d := f.startDaemon(t, cfg)
	defer cleanupDaemon(&d)
	url := "http://" + addr + "/"
	f.waitCaughtUp(t, db, d)

	// A workload runs while the browser loads the page.
	const rows = 3000
	done := make(chan error, 1)
	go func() {
		my, err := f.env.MySQL()
		if err != nil {
			done <- err
			return
		}
		defer my.Close()
		for i := 0; i < rows; i += 100 {
			if _, err := my.Execute(fmt.Sprintf("INSERT INTO %s.t SELECT seq, CONCAT('v', seq) FROM %s.seq_%d_to_%d", db, db, i+1, i+100)); err != nil {
				done <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- nil
	}()
	dom := chromium(t, "--dump-dom", url)
	if !strings.Contains(dom, `http-equiv="refresh"`) || pageField(dom, "source-name") != db || pageField(dom, "source-server-id") == "" {
		t.Fatalf("page during the workload lacks the refresh or the source:\n%s", dom)
	}
	if mode, _ := pageTable(dom, db+".t"); mode != "streaming" {
		t.Fatalf("during the workload %s.t is shown as %q, want streaming:\n%s", db, mode, dom)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// q is quarantined (DROP TABLE refused by default) and t verified.
	f.exec(t, "DROP TABLE q", "INSERT INTO t VALUES (100000, 'last')")
	f.waitCaughtUp(t, db, d)
	vcmd := exec.Command(binPath, "verify", "--config", cfg, "--table", db+".t")
	vcmd.Env = append(vcmd.Environ(), "TM_IT_MYSQL_PASSWORD="+f.env.MySQLPassword, "TM_IT_PG_DSN="+f.env.PGDSN)
	if out, err := vcmd.CombinedOutput(); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}

	// The figures, against the databases, once the page's 5 s cache has
	// turned over.
	var nT, nQ int
	if err := f.pg.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM "`+db+`".t), (SELECT count(*) FROM "`+db+`".q)`).Scan(&nT, &nQ); err != nil {
		t.Fatal(err)
	}
	var checkpoint, qReason string
	if err := f.pg.QueryRow(f.ctx, "SELECT position FROM tidemark.checkpoints WHERE source = $1", db).Scan(&checkpoint); err != nil {
		t.Fatal(err)
	}
	if err := f.pg.QueryRow(f.ctx, "SELECT reason FROM tidemark.tables WHERE source = $1 AND table_name = 'q' AND state = 'quarantined'", db).Scan(&qReason); err != nil {
		t.Fatalf("q is not quarantined: %v", err)
	}
	var verdict string
	var vTables int
	if err := f.pg.QueryRow(f.ctx, "SELECT verdict, tables FROM tidemark.verify_runs WHERE source = $1", db).Scan(&verdict, &vTables); err != nil {
		t.Fatal(err)
	}
	var problems []string
	for deadline := time.Now().Add(30 * time.Second); ; {
		dom = chromium(t, "--dump-dom", url)
		problems = nil
		check := func(what, got, want string) {
			if got != want {
				problems = append(problems, fmt.Sprintf("%s: page %q, database %q", what, got, want))
			}
		}
		check("inserted", pageField(dom, "applied-inserted"), strconv.Itoa(nT+nQ))
		check("checkpoint", pageField(dom, "checkpoint"), checkpoint)
		qMode, qr := pageTable(dom, db+".q")
		check("mode of q", qMode, "quarantined")
		check("reason of q", qr, qReason)
		tMode, _ := pageTable(dom, db+".t")
		check("mode of t", tMode, "streaming")
		check("verify verdict", pageField(dom, "verify-verdict"), verdict)
		check("verify tables", pageField(dom, "verify-tables"), strconv.Itoa(vTables))
		if !strings.Contains(dom, "table quarantined") {
			problems = append(problems, "recent errors lack the quarantine")
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(problems) > 0 {
		t.Fatalf("the page differs from the databases:\n  %s\npage:\n%s", strings.Join(problems, "\n  "), dom)
	}
	if verdict != "equal" || nT != rows+1 {
		t.Fatalf("verify %q, %d rows in t (want equal, %d)", verdict, nT, rows+1)
	}
	shot := filepath.Join(artifactDir(t), "status-page.png")
	chromium(t, "--screenshot="+shot, url)
	if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)
	f.stopOK(t, d)
}
