#!/usr/bin/env bash
# Local MariaDB and a real MySQL 9.7 (sources), PostgreSQL (target) and Apache Kafka (KRaft) for
# tidemark's demo and tests.
#
#   scripts/services.sh up       start all four (initialising data dirs on first run); idempotent
#   scripts/services.sh down     stop all four, keep data
#   scripts/services.sh reset    down + delete all data
#   scripts/services.sh status   show what is running
#   scripts/services.sh env      print shell exports: eval "$(scripts/services.sh env)"
#   scripts/services.sh mysql [args]   mariadb client as the tidemark user
#   scripts/services.sh mysql9 [args]  MySQL 9.7's mysql client (in its root) as the tidemark user
#   scripts/services.sh psql  [args]   psql as the tidemark user on the tidemark database
#
# Data, logs, pid files and sockets live under <repo>/.data/. Servers listen on 127.0.0.1 only.
# Ports: TIDEMARK_MYSQL_PORT (default 33061), TIDEMARK_MYSQL9_PORT (default 33071),
# TIDEMARK_PG_PORT (default 54329), TIDEMARK_KAFKA_PORT (default 19092),
# TIDEMARK_KAFKA_CONTROLLER_PORT (default 19093), TIDEMARK_KAFKA_SASL_PORT (default: the Kafka port + 2, 19094: SASL_SSL,
# SCRAM and PLAIN) and TIDEMARK_KAFKA_SSL_PORT (default 19095: TLS without SASL). The ports used by
# the last `up` are remembered in .data/ports.env, so later commands need no override.
# TLS: a local CA and a server certificate (localhost, 127.0.0.1) made with openssl in .data/tls on
# the first `up` (the CA is TIDEMARK_TEST_TLS_CA in `env`). MariaDB and PostgreSQL accept TLS on their
# port and have a TLS-only account (tidemark_tls: REQUIRE SSL / a hostssl rule); Kafka speaks TLS on
# its SASL_SSL and SSL listeners. A server whose generated configuration changed since it started is
# restarted (MariaDB, Kafka) or reloaded (PostgreSQL) by `up`.
# Kafka: Apache Kafka 4.x jars from Maven Central (scripts/kafka/pom.xml, resolved with mvn into
# .data/kafka/lib, cached in ~/.m2), one node in KRaft combined mode on OpenJDK 17.
# MySQL 9.7: Debian's unstable suite's mysql-server-core (it needs a newer libc than Debian 12's),
# run from a Debian-unstable root made once with debootstrap and shared by every checkout on the
# machine (TIDEMARK_MYSQL9_ROOT, default /var/cache/tidemark/mysql-sid-root; needs root). Its
# datadir is .data/mysql9, bind-mounted into the root inside mysqld's own mount namespace.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
DATA="$REPO/.data"
PORTS_FILE="$DATA/ports.env"
LOG_DIR="$DATA/log"

MY_DATA="$DATA/mariadb"
MY_CNF="$DATA/mariadb.cnf"
MY_LOG="$LOG_DIR/mariadb.err"
MY_INIT_MARK="$DATA/mariadb.initialized"

PG_BIN="${TIDEMARK_PG_BIN:-/usr/lib/postgresql/15/bin}"
PG_DATA="$DATA/pg"
PG_LOG="$LOG_DIR/postgresql.log"
PG_INIT_MARK="$DATA/pg.initialized"

KAFKA_POM="$REPO/scripts/kafka/pom.xml"
KAFKA_DIR="$DATA/kafka"
KAFKA_LIB="$KAFKA_DIR/lib"
KAFKA_LIB_STAMP="$KAFKA_DIR/lib.stamp"
KAFKA_LOGS="$KAFKA_DIR/data"
KAFKA_CONF="$KAFKA_DIR/server.properties"
KAFKA_LOG4J="$KAFKA_DIR/log4j2.properties"
KAFKA_PID="$KAFKA_DIR/kafka.pid"
KAFKA_LOG="$LOG_DIR/kafka.log"
KAFKA_HEAP="${TIDEMARK_KAFKA_HEAP:-512m}"

TLS_DIR="$DATA/tls"
TLS_CA="$TLS_DIR/ca.pem"
TLS_PASSWORD=tidemark-local # the broker's PKCS#12 keystore

APP_USER=tidemark
APP_PASSWORD=tidemark-local
APP_DB=tidemark
SERVER_ID=1001
# TLS-only accounts (MariaDB REQUIRE SSL, PostgreSQL hostssl) and the Kafka SASL user
TLS_USER=tidemark_tls
TLS_USER_PASSWORD=tidemark-tls-local
SASL_USER=tidemark
SASL_PASSWORD=tidemark-sasl-local

# MySQL 9.7 (real server) from a Debian-unstable root shared by every checkout on this machine
M9_CACHE=/var/cache/tidemark
M9_ROOT="${TIDEMARK_MYSQL9_ROOT:-$M9_CACHE/mysql-sid-root}"
M9_HOME="$DATA/mysql9"       # bind-mounted at $M9_MNT inside the root (mysqld's mount namespace)
M9_MNT=/srv/tidemark
M9_LOG="$M9_HOME/mysqld.err"
M9_PID="$M9_HOME/run/mysqld.pid"
M9_INIT_MARK="$DATA/mysql9.initialized"
M9_SERVER_ID=9001

# Unix socket paths are limited to ~107 bytes; deep checkouts fall back to a short dir in /tmp.
RUN_DIR="$DATA/run"
if (( ${#RUN_DIR} + 24 > 100 )); then
	RUN_DIR="/tmp/tidemark-run-$(printf '%s' "$REPO" | cksum | cut -d' ' -f1)"
fi
MY_RUN="$RUN_DIR/mariadb"
MY_SOCK="$MY_RUN/mariadb.sock"
MY_PID="$MY_RUN/mariadb.pid"
PG_RUN="$RUN_DIR/pg"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: ERROR: %s\n' "$*" >&2; exit 1; }

is_root() { [[ $EUID -eq 0 ]]; }

# Run a command as the given service user (root must drop privileges; others run as themselves).
as_user() {
	local user=$1; shift
	if is_root; then runuser -u "$user" -- "$@"; else "$@"; fi
}

# ---------------------------------------------------------------------------------------------
# ports

load_ports() {
	local rec_my="" rec_m9="" rec_pg="" rec_k="" rec_kc="" rec_ks="" rec_kt=""
	if [[ -f $PORTS_FILE ]]; then
		rec_ks=$(sed -n 's/^KAFKA_SASL_PORT=//p' "$PORTS_FILE")
		rec_kt=$(sed -n 's/^KAFKA_SSL_PORT=//p' "$PORTS_FILE")
		rec_my=$(sed -n 's/^MYSQL_PORT=//p' "$PORTS_FILE")
		rec_m9=$(sed -n 's/^MYSQL9_PORT=//p' "$PORTS_FILE")
		rec_pg=$(sed -n 's/^PG_PORT=//p' "$PORTS_FILE")
		rec_k=$(sed -n 's/^KAFKA_PORT=//p' "$PORTS_FILE")
		rec_kc=$(sed -n 's/^KAFKA_CONTROLLER_PORT=//p' "$PORTS_FILE")
	fi
	MY_PORT=${TIDEMARK_MYSQL_PORT:-${rec_my:-33061}}
	M9_PORT=${TIDEMARK_MYSQL9_PORT:-${rec_m9:-33071}}
	PG_PORT=${TIDEMARK_PG_PORT:-${rec_pg:-54329}}
	KAFKA_PORT=${TIDEMARK_KAFKA_PORT:-${rec_k:-19092}}
	KAFKA_CTL_PORT=${TIDEMARK_KAFKA_CONTROLLER_PORT:-${rec_kc:-19093}}
	# The TLS listeners default to the plain listener's port + 2 and + 3, so that a checkout
	# started with only TIDEMARK_KAFKA_PORT (and the controller port) set gets its own.
	KAFKA_SASL_PORT=${TIDEMARK_KAFKA_SASL_PORT:-${rec_ks:-$((KAFKA_PORT + 2))}}
	KAFKA_SSL_PORT=${TIDEMARK_KAFKA_SSL_PORT:-${rec_kt:-$((KAFKA_PORT + 3))}}
	REC_MY_PORT=$rec_my
	REC_M9_PORT=$rec_m9
	REC_PG_PORT=$rec_pg
	REC_KAFKA_PORT=$rec_k
	[[ $MY_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_MYSQL_PORT: $MY_PORT"
	[[ $M9_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_MYSQL9_PORT: $M9_PORT"
	[[ $M9_PORT != "$MY_PORT" ]] || die "TIDEMARK_MYSQL9_PORT and TIDEMARK_MYSQL_PORT must differ ($M9_PORT)"
	[[ $PG_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_PG_PORT: $PG_PORT"
	[[ $KAFKA_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_KAFKA_PORT: $KAFKA_PORT"
	[[ $KAFKA_CTL_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_KAFKA_CONTROLLER_PORT: $KAFKA_CTL_PORT"
	[[ $KAFKA_SASL_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_KAFKA_SASL_PORT: $KAFKA_SASL_PORT"
	[[ $KAFKA_SSL_PORT =~ ^[0-9]+$ ]] || die "bad TIDEMARK_KAFKA_SSL_PORT: $KAFKA_SSL_PORT"
	local uniq
	uniq=$(printf '%s\n' "$KAFKA_PORT" "$KAFKA_CTL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_SSL_PORT" | sort -u | wc -l)
	((uniq == 4)) || die "TIDEMARK_KAFKA_PORT, _CONTROLLER_PORT, _SASL_PORT and _SSL_PORT must differ ($KAFKA_PORT $KAFKA_CTL_PORT $KAFKA_SASL_PORT $KAFKA_SSL_PORT)"
}

save_ports() {
	mkdir -p "$DATA"
	printf 'MYSQL_PORT=%s\nMYSQL9_PORT=%s\nPG_PORT=%s\nKAFKA_PORT=%s\nKAFKA_CONTROLLER_PORT=%s\nKAFKA_SASL_PORT=%s\nKAFKA_SSL_PORT=%s\n' \
		"$MY_PORT" "$M9_PORT" "$PG_PORT" "$KAFKA_PORT" "$KAFKA_CTL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_SSL_PORT" >"$PORTS_FILE"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pg_dsn() {
	printf 'postgres://%s:%s@127.0.0.1:%s/%s?sslmode=disable' "$APP_USER" "$APP_PASSWORD" "$PG_PORT" "$APP_DB"
}

# The TLS-only role's DSN, verifying the server's certificate against the local CA.
pg_tls_dsn() {
	printf 'postgres://%s:%s@127.0.0.1:%s/%s?sslmode=verify-full&sslrootcert=%s' "$TLS_USER" "$TLS_USER_PASSWORD" "$PG_PORT" "$APP_DB" "$TLS_CA"
}

# replace_if_changed NEW DEST: move NEW over DEST; succeeds (0) only when the content changed.
replace_if_changed() {
	if [[ -f $2 ]] && cmp -s "$1" "$2"; then
		rm -f "$1"
		return 1
	fi
	mv -f "$1" "$2"
}

# ---------------------------------------------------------------------------------------------
# TLS: a local CA and one server certificate for all three servers (made once, kept across `up`)

tls_certs() {
	mkdir -p "$TLS_DIR"
	if [[ ! -f $TLS_DIR/server.pem || ! -f $TLS_CA || ! -f $TLS_DIR/kafka-server.p12 ]]; then
		log "creating a local CA and a server certificate in $TLS_DIR (openssl)"
		command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"
		(
			cd "$TLS_DIR"
			rm -f ./*.pem ./*.key ./*.csr ./*.p12 ./*.srl
			openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 3650 \
				-subj "/CN=tidemark local test CA" -addext "basicConstraints=critical,CA:TRUE" \
				-addext "keyUsage=critical,keyCertSign,cRLSign"
			openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost"
			printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' >server.ext
			openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 3650 -extfile server.ext
			openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name kafka \
				-out kafka-server.p12 -passout "pass:$TLS_PASSWORD"
		) >"$LOG_DIR/tls.log" 2>&1 || { tail -n 20 "$LOG_DIR/tls.log" >&2; die "creating the TLS certificates failed (log: $LOG_DIR/tls.log)"; }
	fi
	# Each server reads its own copy of the key (PostgreSQL insists on owning it, mode 0600).
	install -m 600 "$TLS_DIR/server.key" "$TLS_DIR/mariadb-server.key"
	install -m 600 "$TLS_DIR/server.key" "$TLS_DIR/pg-server.key"
	chmod 644 "$TLS_DIR/server.pem" "$TLS_CA"
	chmod 600 "$TLS_DIR/ca.key" "$TLS_DIR/server.key"
	if is_root; then
		chown mysql:mysql "$TLS_DIR/mariadb-server.key"
		chown postgres:postgres "$TLS_DIR/pg-server.key"
		ensure_traversable mysql "$TLS_DIR"
		ensure_traversable postgres "$TLS_DIR"
	fi
}

# ---------------------------------------------------------------------------------------------
# installation

# The service users must be able to reach their data dirs: every parent needs o+x.
ensure_traversable() {
	local user=$1 dir=$2
	is_root || return 0
	local path="" part parts
	IFS=/ read -r -a parts <<<"${dir#/}"
	for part in "${parts[@]}"; do
		[[ -n $part ]] || continue
		path="$path/$part"
		if ! runuser -u "$user" -- test -x "$path" 2>/dev/null; then
			log "chmod o+x $path (so user $user can reach its data)"
			chmod o+x "$path"
		fi
	done
}

ensure_packages() {
	local pkgs=()
	[[ -x /usr/sbin/mariadbd ]] || command -v mariadbd >/dev/null || pkgs+=(mariadb-server mariadb-client)
	[[ -x $PG_BIN/initdb ]] || pkgs+=(postgresql-15 postgresql-client-15)
	[[ -f /usr/share/zoneinfo/Asia/Kolkata ]] || pkgs+=(tzdata)
	command -v java >/dev/null || pkgs+=(openjdk-17-jre-headless)
	command -v mvn >/dev/null || pkgs+=(maven)
	command -v openssl >/dev/null || pkgs+=(openssl) # the local CA and server certificate (.data/tls)
	# the status page's browser test (headless) and the alert rules' check
	command -v chromium >/dev/null || pkgs+=(chromium)
	command -v promtool >/dev/null || pkgs+=(prometheus)
	# the real MySQL 9.7's root file system (made once per machine)
	[[ -x $M9_ROOT/usr/sbin/mysqld ]] || command -v debootstrap >/dev/null || pkgs+=(debootstrap)
	((${#pkgs[@]})) || return 0
	is_root || die "missing packages (${pkgs[*]}); install them or run as root"
	log "installing ${pkgs[*]} with apt-get"
	local policy=/usr/sbin/policy-rc.d created=0
	if [[ ! -e $policy ]]; then
		# keep apt from starting system servers (a mariadbd on :3306, a postgres cluster)
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		created=1
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	DEBIAN_FRONTEND=noninteractive apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 "${pkgs[@]}"
	if ((created)); then
		rm -f "$policy"
		trap - EXIT
	fi
}

# ---------------------------------------------------------------------------------------------
# MariaDB

my_admin() { mariadb-admin --no-defaults --socket="$MY_SOCK" --user=root "$@"; }
my_root() { mariadb --no-defaults --socket="$MY_SOCK" --user=root "$@"; }

my_running() {
	[[ -f $MY_PID ]] || return 1
	local pid
	pid=$(cat "$MY_PID" 2>/dev/null) || return 1
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
	my_admin --connect-timeout=2 ping >/dev/null 2>&1
}

write_my_cnf() {
	cat >"$1" <<EOF
# generated by scripts/services.sh; rewritten on every 'up'
[mariadbd]
datadir = $MY_DATA
socket = $MY_SOCK
pid-file = $MY_PID
log-error = $MY_LOG
bind-address = 127.0.0.1
port = $MY_PORT
skip-name-resolve
# binlog: what tidemark needs from a source
server-id = $SERVER_ID
log-bin = mysql-bin
binlog-format = ROW
binlog-row-image = FULL
binlog-row-metadata = FULL
gtid-domain-id = 0
gtid-strict-mode = ON
log-slave-updates
# test-friendly durability and limits
sync-binlog = 0
innodb-flush-log-at-trx-commit = 2
max-allowed-packet = 64M
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
# TLS on the same port (clients choose); the account $TLS_USER requires it
ssl-ca = $TLS_CA
ssl-cert = $TLS_DIR/server.pem
ssl-key = $TLS_DIR/mariadb-server.key
EOF
}

my_start() {
	if my_running; then
		if [[ -n $REC_MY_PORT && $REC_MY_PORT != "$MY_PORT" ]]; then
			die "MariaDB is running on port $REC_MY_PORT, not $MY_PORT; run '$0 down' first"
		fi
		write_my_cnf "$MY_CNF.new"
		if ! replace_if_changed "$MY_CNF.new" "$MY_CNF"; then
			log "MariaDB already running (pid $(cat "$MY_PID"), port $MY_PORT)"
			my_tls_user
			return 0
		fi
		log "MariaDB's configuration changed since it started: restarting it"
		my_stop
	fi
	if port_in_use "$MY_PORT"; then
		die "port $MY_PORT is already in use (another checkout's services?); set TIDEMARK_MYSQL_PORT to a free port"
	fi
	mkdir -p "$DATA" "$LOG_DIR" "$MY_RUN"
	ensure_traversable mysql "$DATA"
	ensure_traversable mysql "$MY_RUN"
	touch "$MY_LOG"
	if is_root; then chown mysql:mysql "$MY_RUN" "$MY_LOG"; fi
	write_my_cnf "$MY_CNF"

	local fresh=0
	if [[ ! -d $MY_DATA/mysql ]]; then
		log "initialising MariaDB data dir $MY_DATA"
		rm -rf "$MY_DATA" "$MY_INIT_MARK"
		mkdir -p "$MY_DATA"
		if is_root; then chown mysql:mysql "$MY_DATA"; fi
		local user_opt=()
		if is_root; then user_opt=(--user=mysql); fi
		mariadb-install-db --defaults-file="$MY_CNF" "${user_opt[@]}" --datadir="$MY_DATA" \
			--auth-root-authentication-method=normal --skip-test-db >"$LOG_DIR/mariadb-install.log" 2>&1 ||
			{ tail -n 30 "$LOG_DIR/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
		fresh=1
	fi

	log "starting MariaDB on 127.0.0.1:$MY_PORT"
	local user_opt=()
	if is_root; then user_opt=(--user=mysql); fi
	rm -f "$MY_PID"
	setsid nohup mariadbd --defaults-file="$MY_CNF" "${user_opt[@]}" </dev/null >>"$MY_LOG" 2>&1 &
	local pid=$! i
	for ((i = 0; i < 120; i++)); do
		if my_admin --connect-timeout=1 ping >/dev/null 2>&1; then break; fi
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 40 "$MY_LOG" >&2
			die "mariadbd exited during startup (log: $MY_LOG)"
		fi
		sleep 0.5
	done
	if ! my_admin --connect-timeout=1 ping >/dev/null 2>&1; then
		tail -n 40 "$MY_LOG" >&2
		die "MariaDB did not accept connections within 60 s (log: $MY_LOG)"
	fi

	if ((fresh)) || [[ ! -f $MY_INIT_MARK ]]; then
		my_init_contents
	fi
	my_tls_user
}

# The TLS-only account (REQUIRE SSL), made on every `up` so older data dirs get it too; not binlogged.
my_tls_user() {
	my_root <<EOF || die "creating the MariaDB user $TLS_USER failed"
SET SESSION sql_log_bin=0;
CREATE USER IF NOT EXISTS '$TLS_USER'@'127.0.0.1' IDENTIFIED BY '$TLS_USER_PASSWORD' REQUIRE SSL;
GRANT ALL PRIVILEGES ON *.* TO '$TLS_USER'@'127.0.0.1';
EOF
}

# One-time setup; nothing here reaches the binlog, and the binlog is reset afterwards so the first
# transaction anyone runs is GTID 0-$SERVER_ID-1.
my_init_contents() {
	log "loading time-zone tables (not binlogged)"
	{
		echo "SET SESSION sql_log_bin=0;"
		mariadb-tzinfo-to-sql --no-defaults /usr/share/zoneinfo 2>/dev/null
	} | my_root mysql || die "loading time-zone tables failed"
	log "creating user $APP_USER (not binlogged)"
	my_root <<EOF
SET SESSION sql_log_bin=0;
CREATE USER IF NOT EXISTS '$APP_USER'@'127.0.0.1' IDENTIFIED BY '$APP_PASSWORD';
CREATE USER IF NOT EXISTS '$APP_USER'@'localhost' IDENTIFIED BY '$APP_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$APP_USER'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$APP_USER'@'localhost' WITH GRANT OPTION;
FLUSH PRIVILEGES;
RESET MASTER;
EOF
	touch "$MY_INIT_MARK"
}

my_stop() {
	if my_running; then
		log "stopping MariaDB"
		local pid
		pid=$(cat "$MY_PID")
		my_admin shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
		local i
		for ((i = 0; i < 120; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.5
		done
		if kill -0 "$pid" 2>/dev/null; then die "MariaDB (pid $pid) did not stop"; fi
	elif [[ -f $MY_PID ]] && kill -0 "$(cat "$MY_PID")" 2>/dev/null; then
		log "stopping unresponsive MariaDB (pid $(cat "$MY_PID"))"
		kill -TERM "$(cat "$MY_PID")" || true
	fi
}

# ---------------------------------------------------------------------------------------------
# MySQL 9.7 (a real server from Debian's unstable suite, run from a Debian-unstable root)

# The Debian mirror this machine's apt already uses (the first deb entry of a Debian suite with
# the main component in /etc/apt/sources.list or /etc/apt/sources.list.d/*.{list,sources});
# TIDEMARK_DEBIAN_MIRROR overrides it.
debian_mirror() {
	if [[ -n ${TIDEMARK_DEBIAN_MIRROR:-} ]]; then
		printf '%s\n' "$TIDEMARK_DEBIAN_MIRROR"
		return 0
	fi
	local files=() f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] && files+=("$f")
	done
	((${#files[@]})) || return 1
	awk '
		function debian_suite(s) {
			return s ~ /^(buster|bullseye|bookworm|trixie|forky|duke|sid|unstable|testing|stable|oldstable)(-updates|-backports)?$/
		}
		function consider(types, uris, suites, comps,   u, s, n, i) {
			if ((" " types " ") !~ / deb / || (" " comps " ") !~ / main /) return
			n = split(suites, s, /[ \t]+/)
			for (i = 1; i <= n; i++) if (debian_suite(s[i])) { split(uris, u, /[ \t]+/); print u[1]; found = 1; exit }
		}
		FNR == 1 { if (prev ~ /\.sources$/) consider(types, uris, suites, comps); types = uris = suites = comps = ""; prev = FILENAME }
		FILENAME ~ /\.sources$/ {
			if ($0 ~ /^[ \t]*$/) { consider(types, uris, suites, comps); types = uris = suites = comps = ""; next }
			if ($0 ~ /^[ \t]*#/) next
			line = $0; key = tolower(line); sub(/:.*/, "", key); sub(/^[^:]*:[ \t]*/, "", line)
			if (key == "types") types = line; else if (key == "uris") uris = line
			else if (key == "suites") suites = line; else if (key == "components") comps = line
			next
		}
		/^[ \t]*deb[ \t]/ {
			line = $0; sub(/\[[^]]*\]/, "", line); n = split(line, w, /[ \t]+/)
			i = (w[1] == "") ? 2 : 1
			c = ""; for (j = i + 3; j <= n; j++) c = c " " w[j]
			consider("deb", w[i + 1], w[i + 2], c)
		}
		END { if (!found && prev ~ /\.sources$/) consider(types, uris, suites, comps) }
	' "${files[@]}"
}

# The Debian-unstable root with mysql-server-core: made once per machine (about 3 minutes and
# 650 MB), outside any checkout; flock keeps two checkouts from building it at the same time, and
# it is built in a temporary directory renamed into place only when complete.
m9_ensure_root() {
	[[ -x $M9_ROOT/usr/sbin/mysqld && -d $M9_ROOT$M9_MNT ]] && return 0
	is_root || die "the real MySQL 9.7 runs from a Debian-unstable root made with debootstrap and chroot: run as root (missing $M9_ROOT)"
	command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install debootstrap)"
	mkdir -p "$(dirname "$M9_ROOT")" "$LOG_DIR"
	local lock="$M9_ROOT.lock"
	exec 9>"$lock"
	if ! flock -n 9; then
		log "waiting for another checkout building $M9_ROOT (lock $lock)"
		flock 9
	fi
	if [[ -x $M9_ROOT/usr/sbin/mysqld && -d $M9_ROOT$M9_MNT ]]; then
		exec 9>&-
		return 0
	fi
	local mirror
	mirror=$(debian_mirror) || true
	[[ -n $mirror ]] || die "no Debian mirror found in /etc/apt/sources.list(.d) (set TIDEMARK_DEBIAN_MIRROR)"
	local tmp dlog="$LOG_DIR/mysql9-debootstrap.log"
	rm -rf "$M9_ROOT".tmp.*
	tmp=$(mktemp -d "$M9_ROOT.tmp.XXXXXX")
	log "creating the Debian-unstable root for MySQL 9.7 in $M9_ROOT (once per machine; ~3 min, ~650 MB) from $mirror"
	if ! debootstrap --variant=minbase --include=mysql-server-core,mysql-client-core,tzdata \
		sid "$tmp" "$mirror" >"$dlog" 2>&1; then
		rm -rf "$tmp"
		exec 9>&-
		if grep -q "Couldn't find these debs" "$dlog"; then
			die "Debian's unstable suite at $mirror no longer offers mysql-server-core / mysql-client-core ($(grep "Couldn't find these debs" "$dlog" | head -n1)): the real MySQL 9.7 the MySQL tests need cannot be installed; see docs/MYSQL.md (log: $dlog)"
		fi
		tail -n 30 "$dlog" >&2
		die "debootstrap of Debian unstable failed (log: $dlog)"
	fi
	[[ -x $tmp/usr/sbin/mysqld ]] || { rm -rf "$tmp"; exec 9>&-; die "debootstrap finished but $tmp has no /usr/sbin/mysqld (log: $dlog)"; }
	mkdir -p "$tmp$M9_MNT"
	rm -rf "$tmp"/var/cache/apt/archives/*.deb
	mv -T "$tmp" "$M9_ROOT"
	exec 9>&-
	log "MySQL root ready: $(m9_version)"
}

m9_pid() { cat "$M9_PID" 2>/dev/null; }

# A command inside the running mysqld's mount namespace and root (it sees .data/mysql9 at $M9_MNT).
m9_exec() {
	local pid
	pid=$(m9_pid) || return 1
	[[ -n $pid ]] || return 1
	nsenter --target "$pid" --mount --root --wd "$@"
}
m9_root_sql() { m9_exec /usr/bin/mysql --no-defaults --socket="$M9_MNT/run/mysqld.sock" --user=root "$@"; }

m9_running() {
	local pid
	pid=$(m9_pid) || return 1
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
	m9_root_sql --connect-timeout=2 -e 'SELECT 1' >/dev/null 2>&1
}

m9_version() { chroot "$M9_ROOT" /usr/sbin/mysqld --version 2>/dev/null | sed -n 's/.*Ver \([^ ]*\).*/\1/p'; }

m9_write_cnf() {
	cat >"$M9_HOME/my.cnf" <<EOT
# generated by scripts/services.sh; rewritten on every 'up' (paths are inside the MySQL root)
[mysqld]
user = root
datadir = $M9_MNT/data
socket = $M9_MNT/run/mysqld.sock
pid-file = $M9_MNT/run/mysqld.pid
log-error = $M9_MNT/mysqld.err
tmpdir = /tmp
bind-address = 127.0.0.1
port = $M9_PORT
mysqlx = OFF
skip-name-resolve
secure-file-priv =
# binlog: what tidemark needs from a source
server-id = $M9_SERVER_ID
log-bin = binlog
binlog-row-image = FULL
binlog-row-metadata = FULL
gtid-mode = ON
enforce-gtid-consistency = ON
# test-friendly durability and limits
sync-binlog = 0
innodb-flush-log-at-trx-commit = 2
innodb-buffer-pool-size = 128M
max-allowed-packet = 64M
max-connections = 300
character-set-server = utf8mb4
EOT
}

# mysqld runs in its own mount namespace (unshare) where .data/mysql9 is bind-mounted at $M9_MNT
# inside the root: nothing stays mounted on the host, whatever way mysqld ends.
M9_MYSQLD=(unshare --mount --propagation private
	sh -c 'mount --bind "$1" "$0$2" && shift 2 && exec chroot "$0" "$@"' "$M9_ROOT" "$M9_HOME" "$M9_MNT"
	/usr/sbin/mysqld --defaults-file="$M9_MNT/my.cnf")

m9_start() {
	if m9_running; then
		if [[ -n $REC_M9_PORT && $REC_M9_PORT != "$M9_PORT" ]]; then
			die "MySQL 9.7 is running on port $REC_M9_PORT, not $M9_PORT; run '$0 down' first"
		fi
		log "MySQL $(m9_version) already running (pid $(m9_pid), port $M9_PORT)"
		return 0
	fi
	if port_in_use "$M9_PORT"; then
		die "port $M9_PORT is already in use (another checkout's services?); set TIDEMARK_MYSQL9_PORT to a free port"
	fi
	m9_ensure_root
	mkdir -p "$M9_HOME/run" "$LOG_DIR"
	m9_write_cnf
	local fresh=0
	if [[ ! -d $M9_HOME/data/mysql ]]; then
		log "initialising MySQL $(m9_version) data dir $M9_HOME/data"
		rm -rf "$M9_HOME/data" "$M9_INIT_MARK"
		: >"$M9_LOG"
		"${M9_MYSQLD[@]}" --initialize-insecure >"$LOG_DIR/mysql9-init.log" 2>&1 ||
			{ tail -n 30 "$M9_LOG" "$LOG_DIR/mysql9-init.log" >&2; die "mysqld --initialize-insecure failed (log: $M9_LOG)"; }
		fresh=1
	fi
	log "starting MySQL $(m9_version) on 127.0.0.1:$M9_PORT"
	rm -f "$M9_PID"
	setsid nohup "${M9_MYSQLD[@]}" </dev/null >>"$LOG_DIR/mysql9.out" 2>&1 &
	local pid=$! i
	for ((i = 0; i < 240; i++)); do
		if m9_running; then break; fi
		if ! kill -0 "$pid" 2>/dev/null && ! { [[ -f $M9_PID ]] && kill -0 "$(m9_pid)" 2>/dev/null; }; then
			tail -n 40 "$M9_LOG" >&2
			die "mysqld exited during startup (log: $M9_LOG)"
		fi
		sleep 0.5
	done
	m9_running || { tail -n 40 "$M9_LOG" >&2; die "MySQL did not accept connections within 120 s (log: $M9_LOG)"; }
	if ((fresh)) || [[ ! -f $M9_INIT_MARK ]]; then
		m9_init_contents
	fi
}

# One-time setup, not binlogged; the binlog and GTID history are reset afterwards so the first
# transaction anyone runs is <server_uuid>:1.
m9_init_contents() {
	log "loading MySQL time-zone tables (not binlogged)"
	{
		echo "SET SESSION sql_log_bin=0;"
		chroot "$M9_ROOT" /usr/bin/mysql_tzinfo_to_sql /usr/share/zoneinfo 2>/dev/null
	} | m9_root_sql mysql || die "loading MySQL time-zone tables failed"
	log "creating MySQL user $APP_USER (caching_sha2_password, not binlogged)"
	m9_root_sql <<EOT || die "creating the MySQL user failed"
SET SESSION sql_log_bin=0;
CREATE USER IF NOT EXISTS '$APP_USER'@'127.0.0.1' IDENTIFIED BY '$APP_PASSWORD';
CREATE USER IF NOT EXISTS '$APP_USER'@'localhost' IDENTIFIED BY '$APP_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$APP_USER'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$APP_USER'@'localhost' WITH GRANT OPTION;
RESET BINARY LOGS AND GTIDS;
EOT
	touch "$M9_INIT_MARK"
}

m9_stop() {
	local pid
	pid=$(m9_pid) || return 0
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
	log "stopping MySQL"
	kill -TERM "$pid" 2>/dev/null || true
	local i
	for ((i = 0; i < 120; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then die "MySQL (pid $pid) did not stop"; fi
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL

pg_ctl() { as_user postgres "$PG_BIN/pg_ctl" "$@"; }
pg_root_psql() {
	as_user postgres "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_RUN" -p "$PG_PORT" -U postgres "$@"
}

pg_running() {
	[[ -f $PG_DATA/PG_VERSION ]] || return 1
	pg_ctl -D "$PG_DATA" status >/dev/null 2>&1 || return 1
	"$PG_BIN/pg_isready" -q -h "$PG_RUN" -p "$PG_PORT" -t 2 >/dev/null 2>&1
}

# Writes tidemark.conf and pg_hba.conf; succeeds (0) when either changed.
pg_write_conf() {
	local conf="$PG_DATA/tidemark.conf" hba="$PG_DATA/pg_hba.conf" changed=1
	cat >"$conf.new" <<EOF
# generated by scripts/services.sh; rewritten on every 'up'
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_RUN'
fsync = on
max_connections = 200
password_encryption = 'scram-sha-256'
# when a row became visible: pg_xact_commit_timestamp(xmin) (the bench's lag, T3)
track_commit_timestamp = on
# TLS on the same port; the role $TLS_USER may connect only with it (pg_hba.conf: hostssl)
ssl = on
ssl_cert_file = '$TLS_DIR/server.pem'
ssl_key_file = '$TLS_DIR/pg-server.key'
ssl_ca_file = '$TLS_CA'
EOF
	# trust on the local socket (setup/debugging); the password is really checked over TCP
	cat >"$hba.new" <<EOF
# generated by scripts/services.sh; rewritten on every 'up'
local     all   all                          trust
hostssl   all   $TLS_USER   127.0.0.1/32   scram-sha-256
hostnossl all   $TLS_USER   127.0.0.1/32   reject
host      all   all         127.0.0.1/32   scram-sha-256
host      all   all         ::1/128        scram-sha-256
EOF
	replace_if_changed "$conf.new" "$conf" && changed=0
	replace_if_changed "$hba.new" "$hba" && changed=0
	if is_root; then chown postgres:postgres "$conf" "$hba"; fi
	return $changed
}

# The TLS-only role, made on every `up` so older data dirs get it too.
pg_tls_role() {
	pg_root_psql -d postgres <<EOF || die "creating the PostgreSQL role $TLS_USER failed"
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$TLS_USER') THEN
    CREATE ROLE $TLS_USER;
  END IF;
END \$\$;
ALTER ROLE $TLS_USER WITH LOGIN SUPERUSER PASSWORD '$TLS_USER_PASSWORD';
EOF
}

pg_start() {
	if pg_running; then
		if [[ -n $REC_PG_PORT && $REC_PG_PORT != "$PG_PORT" ]]; then
			die "PostgreSQL is running on port $REC_PG_PORT, not $PG_PORT; run '$0 down' first"
		fi
		if pg_write_conf; then
			log "PostgreSQL's configuration changed: reloading it"
			pg_ctl -D "$PG_DATA" reload >/dev/null
		else
			log "PostgreSQL already running (port $PG_PORT)"
		fi
		pg_tls_role
		return 0
	fi
	if port_in_use "$PG_PORT"; then
		die "port $PG_PORT is already in use (another checkout's services?); set TIDEMARK_PG_PORT to a free port"
	fi
	[[ -x $PG_BIN/initdb ]] || die "PostgreSQL 15 not found at $PG_BIN (set TIDEMARK_PG_BIN)"
	mkdir -p "$DATA" "$LOG_DIR" "$PG_RUN"
	ensure_traversable postgres "$DATA"
	ensure_traversable postgres "$PG_RUN"
	touch "$PG_LOG"
	if is_root; then chown postgres:postgres "$PG_RUN" "$PG_LOG"; fi

	if [[ ! -f $PG_DATA/PG_VERSION ]]; then
		log "initialising PostgreSQL data dir $PG_DATA"
		rm -rf "$PG_DATA" "$PG_INIT_MARK"
		mkdir -p "$PG_DATA"
		chmod 700 "$PG_DATA"
		if is_root; then chown postgres:postgres "$PG_DATA"; fi
		as_user postgres "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust \
			--encoding=UTF8 --locale=C.UTF-8 >"$LOG_DIR/pg-initdb.log" 2>&1 ||
			{ tail -n 30 "$LOG_DIR/pg-initdb.log" >&2; die "initdb failed"; }
		echo "include_if_exists = 'tidemark.conf'" | as_user postgres tee -a "$PG_DATA/postgresql.conf" >/dev/null
	fi
	pg_write_conf || true

	log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
	if ! pg_ctl -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start >/dev/null; then
		tail -n 40 "$PG_LOG" >&2
		die "PostgreSQL did not start (log: $PG_LOG)"
	fi

	if [[ ! -f $PG_INIT_MARK ]]; then
		log "creating role and database $APP_USER"
		pg_root_psql -d postgres <<EOF
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$APP_USER') THEN
    CREATE ROLE $APP_USER;
  END IF;
END \$\$;
ALTER ROLE $APP_USER WITH LOGIN SUPERUSER PASSWORD '$APP_PASSWORD';
SELECT 'CREATE DATABASE $APP_DB OWNER $APP_USER'
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$APP_DB') \gexec
EOF
		touch "$PG_INIT_MARK"
	fi
	pg_tls_role
}

pg_stop() {
	[[ -f $PG_DATA/PG_VERSION ]] || return 0
	if pg_ctl -D "$PG_DATA" status >/dev/null 2>&1; then
		log "stopping PostgreSQL"
		pg_ctl -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null
	fi
}

# ---------------------------------------------------------------------------------------------
# Apache Kafka (KRaft combined mode: one process is controller and broker)

# The JVM command line of the broker and its storage tool.
KAFKA_JAVA=(java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true
	-Dlog4j2.configurationFile="$KAFKA_LOG4J" -cp "$KAFKA_LIB/*")
kafka_java() { "${KAFKA_JAVA[@]}" "$@"; }

kafka_running() {
	[[ -f $KAFKA_PID ]] || return 1
	local pid
	pid=$(cat "$KAFKA_PID" 2>/dev/null) || return 1
	[[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
	port_in_use "$KAFKA_PORT"
}

# The jars: resolved from Maven Central once per pom (cached in ~/.m2 across checkouts).
kafka_jars() {
	local want
	want=$(cksum <"$KAFKA_POM" | cut -d' ' -f1)
	if [[ -f $KAFKA_LIB_STAMP && $(cat "$KAFKA_LIB_STAMP") == "$want" ]] && ls "$KAFKA_LIB"/kafka_2.13-*.jar >/dev/null 2>&1; then
		return 0
	fi
	command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
	log "resolving Apache Kafka jars with mvn (scripts/kafka/pom.xml)"
	rm -rf "$KAFKA_LIB" "$KAFKA_LIB_STAMP"
	mkdir -p "$KAFKA_LIB" "$LOG_DIR"
	if ! mvn -B -q -f "$KAFKA_POM" dependency:copy-dependencies -DoutputDirectory="$KAFKA_LIB" \
		>"$LOG_DIR/kafka-mvn.log" 2>&1; then
		tail -n 30 "$LOG_DIR/kafka-mvn.log" >&2
		die "mvn could not resolve the Kafka jars (log: $LOG_DIR/kafka-mvn.log)"
	fi
	printf '%s\n' "$want" >"$KAFKA_LIB_STAMP"
}

kafka_write_conf() {
	cat >"$1" <<EOF
# generated by scripts/services.sh; rewritten on every 'up'
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CTL_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CTL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
# TLS (SASL_SSL and SSL listeners): the local server certificate; SASL: SCRAM users (added at format
# time, --add-scram) and one PLAIN user
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/kafka-server.p12
ssl.keystore.password=$TLS_PASSWORD
ssl.key.password=$TLS_PASSWORD
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER="$SASL_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
log.dirs=$KAFKA_LOGS
num.partitions=1
auto.create.topics.enable=true
# one node: every internal topic has one replica
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# tests: no initial rebalance delay, modest segments, test topics expire after a day
group.initial.rebalance.delay.ms=0
log.retention.hours=24
log.segment.bytes=67108864
num.network.threads=2
num.io.threads=4
EOF
	cat >"$KAFKA_LOG4J" <<EOF
# generated by scripts/services.sh
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $KAFKA_LOG
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
EOF
}

kafka_start() {
	if kafka_running; then
		if [[ -n $REC_KAFKA_PORT && $REC_KAFKA_PORT != "$KAFKA_PORT" ]]; then
			die "Kafka is running on port $REC_KAFKA_PORT, not $KAFKA_PORT; run '$0 down' first"
		fi
		mkdir -p "$KAFKA_DIR"
		kafka_write_conf "$KAFKA_CONF.new"
		if ! replace_if_changed "$KAFKA_CONF.new" "$KAFKA_CONF"; then
			log "Kafka already running (pid $(cat "$KAFKA_PID"), port $KAFKA_PORT)"
			return 0
		fi
		log "Kafka's configuration changed since it started: restarting it"
		kafka_stop
	fi
	local p
	for p in "$KAFKA_PORT" "$KAFKA_CTL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_SSL_PORT"; do
		if port_in_use "$p"; then
			die "port $p is already in use (another checkout's services?); set TIDEMARK_KAFKA_PORT / TIDEMARK_KAFKA_CONTROLLER_PORT to free ports"
		fi
	done
	command -v java >/dev/null || die "java not found (OpenJDK 17: apt-get install openjdk-17-jre-headless)"
	kafka_jars
	mkdir -p "$KAFKA_DIR" "$LOG_DIR"
	kafka_write_conf "$KAFKA_CONF"
	if [[ ! -f $KAFKA_LOGS/meta.properties ]]; then
		log "formatting Kafka storage $KAFKA_LOGS (KRaft)"
		rm -rf "$KAFKA_LOGS"
		local cluster_id
		cluster_id=$(kafka_java kafka.tools.StorageTool random-uuid 2>>"$LOG_DIR/kafka-format.log") ||
			{ tail -n 30 "$LOG_DIR/kafka-format.log" >&2; die "kafka-storage random-uuid failed"; }
		kafka_java kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_CONF" \
			--add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]" \
			--add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]" \
			>>"$LOG_DIR/kafka-format.log" 2>&1 ||
			{ tail -n 30 "$LOG_DIR/kafka-format.log" >&2; die "kafka-storage format failed"; }
	fi
	log "starting Kafka on 127.0.0.1:$KAFKA_PORT (controller $KAFKA_CTL_PORT)"
	rm -f "$KAFKA_PID"
	: >>"$KAFKA_LOG"
	local mark
	mark=$(wc -l <"$KAFKA_LOG")
	setsid nohup "${KAFKA_JAVA[@]}" kafka.Kafka "$KAFKA_CONF" </dev/null >>"$LOG_DIR/kafka.out" 2>&1 &
	local pid=$! i
	echo "$pid" >"$KAFKA_PID"
	for ((i = 0; i < 240; i++)); do
		if tail -n +"$((mark + 1))" "$KAFKA_LOG" | grep -q 'Kafka Server started' && port_in_use "$KAFKA_PORT"; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 40 "$KAFKA_LOG" "$LOG_DIR/kafka.out" >&2
			die "Kafka exited during startup (logs: $KAFKA_LOG, $LOG_DIR/kafka.out)"
		fi
		sleep 0.5
	done
	tail -n 40 "$KAFKA_LOG" "$LOG_DIR/kafka.out" >&2
	die "Kafka did not start within 120 s (log: $KAFKA_LOG)"
}

kafka_stop() {
	[[ -f $KAFKA_PID ]] || return 0
	local pid
	pid=$(cat "$KAFKA_PID" 2>/dev/null) || return 0
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		log "stopping Kafka"
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for ((i = 0; i < 120; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.5
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "Kafka (pid $pid) did not stop within 60 s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$KAFKA_PID"
}

# ---------------------------------------------------------------------------------------------
# commands

print_env() {
	cat <<EOF
export TIDEMARK_TEST_MYSQL_ADDR=127.0.0.1:$MY_PORT
export TIDEMARK_TEST_MYSQL_USER=$APP_USER
export TIDEMARK_TEST_MYSQL_PASSWORD=$APP_PASSWORD
export TIDEMARK_TEST_MYSQL_SOCKET=$MY_SOCK
export TIDEMARK_TEST_MYSQL9_ADDR=127.0.0.1:$M9_PORT
export TIDEMARK_TEST_MYSQL9_USER=$APP_USER
export TIDEMARK_TEST_MYSQL9_PASSWORD=$APP_PASSWORD
export TIDEMARK_TEST_MYSQL9_ROOT=$M9_ROOT
export TIDEMARK_TEST_MYSQL9_CA=$M9_HOME/data/ca.pem
export TIDEMARK_TEST_PG_DSN='$(pg_dsn)'
export TIDEMARK_TEST_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
export TIDEMARK_TEST_TLS_CA=$TLS_CA
export TIDEMARK_TEST_MYSQL_TLS_USER=$TLS_USER
export TIDEMARK_TEST_MYSQL_TLS_PASSWORD=$TLS_USER_PASSWORD
export TIDEMARK_TEST_PG_TLS_DSN='$(pg_tls_dsn)'
export TIDEMARK_TEST_KAFKA_SASL_BROKERS=127.0.0.1:$KAFKA_SASL_PORT
export TIDEMARK_TEST_KAFKA_SSL_BROKERS=127.0.0.1:$KAFKA_SSL_PORT
export TIDEMARK_TEST_KAFKA_SASL_USER=$SASL_USER
export TIDEMARK_TEST_KAFKA_SASL_PASSWORD=$SASL_PASSWORD
EOF
}

print_summary() {
	cat <<EOF
MariaDB $(mariadbd --version 2>/dev/null | sed -n 's/.*Ver \([^ ]*\).*/\1/p') (source)
  address   127.0.0.1:$MY_PORT   socket $MY_SOCK
  user      $APP_USER / $APP_PASSWORD   (binlog ROW/FULL, GTID strict, server_id $SERVER_ID)
  client    $0 mysql
MySQL $(m9_version) (source; Debian unstable's mysql-server-core, root $M9_ROOT)
  address   127.0.0.1:$M9_PORT
  user      $APP_USER / $APP_PASSWORD   (caching_sha2_password; binlog ROW/FULL, gtid_mode ON, server_id $M9_SERVER_ID)
  client    $0 mysql9
PostgreSQL $("$PG_BIN/postgres" --version 2>/dev/null | awk '{print $3}') (target)
  DSN       $(pg_dsn)
  client    $0 psql
Apache Kafka $(ls "$KAFKA_LIB"/kafka_2.13-*.jar 2>/dev/null | sed -n 's/.*kafka_2.13-\(.*\)\.jar/\1/p') (KRaft, one node)
  brokers   127.0.0.1:$KAFKA_PORT   controller 127.0.0.1:$KAFKA_CTL_PORT
  TLS       SASL_SSL 127.0.0.1:$KAFKA_SASL_PORT (SCRAM-SHA-256/512, PLAIN: $SASL_USER / $SASL_PASSWORD)   SSL 127.0.0.1:$KAFKA_SSL_PORT
TLS: CA $TLS_CA; TLS-only user $TLS_USER / $TLS_USER_PASSWORD (MariaDB REQUIRE SSL, PostgreSQL hostssl)
Data and logs: $DATA
For tests: eval "\$($0 env)"
EOF
}

cmd_up() {
	ensure_packages
	# fail before starting anything if a port we would take is held by someone else
	if ! my_running && port_in_use "$MY_PORT"; then
		die "port $MY_PORT is already in use (another checkout's services?); set TIDEMARK_MYSQL_PORT to a free port"
	fi
	if ! m9_running && port_in_use "$M9_PORT"; then
		die "port $M9_PORT is already in use (another checkout's services?); set TIDEMARK_MYSQL9_PORT to a free port"
	fi
	if ! pg_running && port_in_use "$PG_PORT"; then
		die "port $PG_PORT is already in use (another checkout's services?); set TIDEMARK_PG_PORT to a free port"
	fi
	if ! kafka_running; then
		local p
		for p in "$KAFKA_PORT" "$KAFKA_CTL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_SSL_PORT"; do
			if port_in_use "$p"; then
				die "port $p is already in use (another checkout's services?); set TIDEMARK_KAFKA_PORT / TIDEMARK_KAFKA_CONTROLLER_PORT to free ports"
			fi
		done
	fi
	mkdir -p "$LOG_DIR"
	tls_certs
	my_start
	save_ports
	m9_start
	save_ports
	pg_start
	save_ports
	kafka_start
	save_ports
	print_summary
}

cmd_down() {
	kafka_stop
	my_stop
	m9_stop
	pg_stop
}

cmd_reset() {
	cmd_down
	log "deleting $DATA"
	rm -rf "$DATA"
	case $RUN_DIR in /tmp/tidemark-run-*) rm -rf "$RUN_DIR" ;; esac
}

cmd_status() {
	local rc=0
	if my_running; then
		echo "MariaDB:    running  pid $(cat "$MY_PID")  127.0.0.1:$MY_PORT  socket $MY_SOCK"
	elif [[ -d $MY_DATA/mysql ]]; then
		echo "MariaDB:    stopped  (data in $MY_DATA)"; rc=1
	else
		echo "MariaDB:    not initialised"; rc=1
	fi
	if m9_running; then
		echo "MySQL 9.7:  running  pid $(m9_pid)  127.0.0.1:$M9_PORT  (root $M9_ROOT)"
	elif [[ -d $M9_HOME/data/mysql ]]; then
		echo "MySQL 9.7:  stopped  (data in $M9_HOME/data)"; rc=1
	else
		echo "MySQL 9.7:  not initialised"; rc=1
	fi
	if pg_running; then
		echo "PostgreSQL: running  pid $(head -n1 "$PG_DATA/postmaster.pid")  127.0.0.1:$PG_PORT  socket dir $PG_RUN"
	elif [[ -f $PG_DATA/PG_VERSION ]]; then
		echo "PostgreSQL: stopped  (data in $PG_DATA)"; rc=1
	else
		echo "PostgreSQL: not initialised"; rc=1
	fi
	if kafka_running; then
		echo "Kafka:      running  pid $(cat "$KAFKA_PID")  127.0.0.1:$KAFKA_PORT  controller 127.0.0.1:$KAFKA_CTL_PORT"
	elif [[ -f $KAFKA_LOGS/meta.properties ]]; then
		echo "Kafka:      stopped  (data in $KAFKA_LOGS)"; rc=1
	else
		echo "Kafka:      not initialised"; rc=1
	fi
	return $rc
}

usage() {
	sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

load_ports
cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
	up) cmd_up ;;
	down) cmd_down ;;
	reset) cmd_reset ;;
	status) cmd_status ;;
	env) print_env ;;
	mysql | mariadb)
		exec mariadb --no-defaults --protocol=TCP --host=127.0.0.1 --port="$MY_PORT" \
			--user="$APP_USER" --password="$APP_PASSWORD" "$@" ;;
	mysql9)
		exec chroot "$M9_ROOT" /usr/bin/mysql --no-defaults --protocol=TCP --host=127.0.0.1 --port="$M9_PORT" \
			--user="$APP_USER" --password="$APP_PASSWORD" "$@" ;;
	psql) exec "$PG_BIN/psql" -X "$(pg_dsn)" "$@" ;;
	*) usage ;;
esac
