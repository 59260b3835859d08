#!/bin/bash
# A/B of the first-run catch-up (`tidemark catchup` without a checkpoint) on tables already in
# the local MariaDB: each variant (a tidemark binary, a DSN suffix, more YAML) in turn, RUNS
# times, interleaved so that before/after share the machine's load; the copies of run 1 are
# checked with `tidemark verify`. Prints one line per run: the wall-clock time and the load
# average before it. Run from the repository root after `scripts/services.sh up`.
#
#   scripts/bench-catchup-variants.sh 'tidemark_bench_peers.t' 3 \
#     "before|/tmp/tidemark-before||snapshot:\n  parallelism: 2\n" \
#     "after|bin/tidemark||snapshot:\n  parallelism: 2\n"
#
# A variant is "name|binary|dsn-suffix|yaml" (the suffix is appended to the target DSN, e.g.
# "&synchronous_commit=off"; the YAML, with \n escapes, is appended to the config).
#
#   scripts/bench-catchup-variants.sh make-tables   # speedtabs: 40 tables of 10,000 rows
set -euo pipefail
eval "$(scripts/services.sh env)"
if [ "${1:-}" = make-tables ]; then
	{
		echo "DROP DATABASE IF EXISTS speedtabs; CREATE DATABASE speedtabs; USE speedtabs;"
		for i in $(seq -w 1 40); do
			echo "CREATE TABLE t$i (id INT PRIMARY KEY, v INT NOT NULL, name VARCHAR(40) NOT NULL, at DATETIME(6) NOT NULL, KEY v (v));"
			echo "INSERT INTO t$i SELECT seq, seq % 977, CONCAT('name-', seq), '2026-01-01' + INTERVAL seq SECOND FROM seq_1_to_10000;"
		done
	} | scripts/services.sh mysql
	exit 0
fi
export TM_BENCH_PW=$TIDEMARK_TEST_MYSQL_PASSWORD TM_BENCH_DSN=$TIDEMARK_TEST_PG_DSN
include=$1 runs=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 "$runs"); do
	k=0
	for v in "$@"; do
		k=$((k + 1))
		IFS='|' read -r name bin dsnq extra <<<"$v"
		src=benchvar_${k}_$i
		cfg=$dir/$src.yaml
		cat >"$cfg" <<EOC
source:
  name: $src
  addr: $TIDEMARK_TEST_MYSQL_ADDR
  user: $TIDEMARK_TEST_MYSQL_USER
  password: \${TM_BENCH_PW}
  server_id: $((7400 + k * 10 + i))
  time_zone: Asia/Kolkata
  include: ["$include"]
target:
  postgres:
    dsn: \${TM_BENCH_DSN}$dsnq
    schema: $src
log:
  level: warn
EOC
		printf '%b' "$extra" >>"$cfg"
		load=$(cut -d' ' -f1-3 /proc/loadavg)
		t0=$(date +%s.%N)
		if ! "$bin" catchup --config "$cfg" >"$dir/out" 2>&1; then
			echo "$name run $i: tidemark catchup failed:" >&2
			tail -5 "$dir/out" >&2
			exit 1
		fi
		t1=$(date +%s.%N)
		verdict=""
		if [ "$i" = 1 ]; then
			if "$bin" verify --config "$cfg" >"$dir/verify" 2>&1; then verdict=" verify EQUAL"; else verdict=" verify exit $? (DIFFERENT or failed)"; fi
		fi
		printf '%-40s run %d  %6.2fs  load before %s%s\n' "$name" "$i" "$(echo "$t1 - $t0" | bc)" "$load" "$verdict"
		PGOPTIONS='-c client_min_messages=warning' scripts/services.sh psql -q -c "DROP SCHEMA \"$src\" CASCADE" \
			-c "DELETE FROM tidemark.checkpoints WHERE source = '$src'" -c "DELETE FROM tidemark.tables WHERE source = '$src'" \
			-c "DELETE FROM tidemark.watermarks WHERE source = '$src'" >/dev/null
	done
done
