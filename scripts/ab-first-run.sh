#!/bin/bash
# A/B of two tidemark binaries on the first-run snapshot (`tidemark catchup` without a
# checkpoint) of tidemark_bench_peers.t, the table `make bench-peers` loads (run that first),
# each run into a schema of its own, after a CHECKPOINT, the order alternating per round.
# Prints wall, user and sys seconds, peak RSS (KiB), the rows copied and the load before.
#   scripts/ab-first-run.sh BIN_A BIN_B [ROUNDS]   (services up: scripts/services.sh up)
set -euo pipefail
a=${1:?binary A}; b=${2:?binary B}; rounds=${3:-5}
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh env)"
export TM_BENCH_PW=$TIDEMARK_TEST_MYSQL_PASSWORD TM_BENCH_DSN=$TIDEMARK_TEST_PG_DSN
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 "$rounds"); do
  order="A B"; [ $((i % 2)) -eq 0 ] && order="B A"
  for which in $order; do
    bin=$a; [ "$which" = B ] && bin=$b
    src="ab_${which,,}_${i}_$$"
    cat > "$work/cfg.yaml" <<Y
source:
  name: $src
  addr: $TIDEMARK_TEST_MYSQL_ADDR
  user: $TIDEMARK_TEST_MYSQL_USER
  password: \${TM_BENCH_PW}
  server_id: $((7000 + i))
  time_zone: Asia/Kolkata
  include: ["tidemark_bench_peers.t"]
target:
  postgres:
    dsn: \${TM_BENCH_DSN}
    schema: $src
log:
  level: warn
Y
    psql "$TIDEMARK_TEST_PG_DSN" -qc "CHECKPOINT" >/dev/null
    sleep 2
    load=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$bin" catchup --config "$work/cfg.yaml" >"$work/out" 2>&1 || { echo "$which failed:"; tail -5 "$work/out"; exit 1; }
    rows=$(psql "$TIDEMARK_TEST_PG_DSN" -tAc "SELECT count(*) FROM \"$src\".t")
    echo "round $i $which wall/user/sys/peakKiB $(cat "$work/time") rows $rows load_before $load"
    psql "$TIDEMARK_TEST_PG_DSN" -qc "SET client_min_messages = warning; DROP SCHEMA \"$src\" CASCADE"
  done
done
