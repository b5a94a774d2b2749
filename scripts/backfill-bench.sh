#!/usr/bin/env bash
# The live source's backfill throughput against `COPY (SELECT ...) TO STDOUT` of the same table,
# side by side on one throwaway PostgreSQL 15 cluster (scripts/pg-common.sh), alternating runs:
# a table of ROWS rows (default 200,000: int8 key, int, text, numeric, bool), backfilled through
# a live source (postgres/examples/backfill_throughput.rs: DBLog chunks of CHUNK rows, default
# 4,096, the library's DEFAULT_CHUNK_ROWS, each between two marks in the WAL, published once the
# stream passed the high mark)
# and copied with psql to /dev/null over TCP loopback, as the backfill connects. Prints each run's rows per second, the medians and their
# ratio (backfill / COPY). The only concurrent writer is a probe (one insert every 2 ms into
# another table): the live stream's latency (commit to the source's next item, median) during the
# backfill against the same during one idle second before it.
#
# Usage: scripts/backfill-bench.sh        Env: ROWS, CHUNK, RUNS (default 3 of each); BENCH (a
# backfill_throughput binary built elsewhere, instead of this checkout's).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

rows=${ROWS:-200000}
chunk=${CHUNK:-4096}
runs=${RUNS:-3}
[[ -x $PG_BIN/postgres ]] || pg_die "PostgreSQL 15 not found in $PG_BIN"

if [[ -n ${BENCH:-} ]]; then
    bench=$BENCH
else
    pg_log "building the backfill_throughput example (release)"
    (cd "$root" && cargo build --release --quiet -p lanestream-postgres --example backfill_throughput)
    target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    bench=$target_dir/release/examples/backfill_throughput
fi

pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
pg_psql <<SQL
CREATE TABLE bf_bench (id int8 PRIMARY KEY, grp int4 NOT NULL, name text, val numeric(12,2), flag bool);
INSERT INTO bf_bench SELECT i, i % 7, 'row ' || i || ' of the backfill bench', i * 1.5, i % 2 = 0
FROM generate_series(1, $rows) i;
VACUUM ANALYZE bf_bench;
CHECKPOINT;
SQL

now() { date +%s.%N; }
copy_rates=() backfill_rates=() idle_lat=() busy_lat=()
for run in $(seq 1 "$runs"); do
    start=$(now)
    # Over TCP loopback, as the backfill connects (the unix socket would flatter COPY).
    pg_psql -h 127.0.0.1 -p "$PGPORT" -c "COPY (SELECT * FROM bf_bench) TO STDOUT" >/dev/null
    end=$(now)
    rate=$(python3 -c "print(round($rows / ($end - $start)))")
    copy_rates+=("$rate")
    pg_log "run $run: COPY $rate rows/s"
    line=$("$bench" "$url" public_bf_bench "$chunk" "bench_$run" probe)
    pg_psql -Atc "SELECT pg_drop_replication_slot('bench_$run')" >/dev/null
    rate=$(sed -n 's/.*rows_per_s \([0-9]*\).*/\1/p' <<<"$line")
    [[ $line == "rows $rows "* ]] || pg_die "the backfill did not publish every row: $line"
    backfill_rates+=("$rate")
    idle_lat+=("$(sed -n 's/.*idle_latency_ms \([0-9.]*\).*/\1/p' <<<"$line")")
    busy_lat+=("$(sed -n 's/.*backfill_latency_ms \([0-9.]*\).*/\1/p' <<<"$line")")
    pg_log "run $run: backfill $rate rows/s ($line)"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
copy=$(median "${copy_rates[@]}")
backfill=$(median "${backfill_rates[@]}")
ratio=$(python3 -c "print(f'{$backfill / $copy:.2f}')")
idle=$(median "${idle_lat[@]}")
busy=$(median "${busy_lat[@]}")
echo "rows $rows chunk $chunk: COPY median $copy rows/s, backfill median $backfill rows/s, ratio ${ratio}x"
echo "live stream latency (median of medians): idle ${idle} ms, during the backfill ${busy} ms"
