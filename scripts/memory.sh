#!/usr/bin/env bash
# Peak memory of the live pipeline (the lanestream-pipeline harness, release: the pgoutput
# streaming source, 3 durable NDJSON sinks, the bundled defaults) in the two cases that issue 36's
# memory targets name beside steady CDC (which scripts/latency.sh prints), on a throwaway
# PostgreSQL 15 (scripts/pg-common.sh). The figure is the summary's peak_rss_bytes: the process's
# VmHWM, what `/usr/bin/time -v` calls its maximum resident set size.
#
#   backfill: a table of ROWS rows (default 1,000,000: int8 key, int, text, numeric, bool) is
#             backfilled to 3 new sinks while pgbench inserts single-row transactions into another
#             table at PROBE_RATE per second (default 500) beside it. Target: <= 64 MiB.
#   txn:      one transaction of TXN_ROWS inserts (default 2,000,000) streamed to 3 sinks.
#             Target: <= 48 MiB.
#
# Each case checks that every sink's file holds at least the rows written (the e2e scripts check
# contents; this one measures). Not run by CI (it takes minutes); run it by hand.
#
# Usage: scripts/memory.sh [backfill|txn]... (default: both)
# Env: ROWS, PROBE_RATE, TXN_ROWS; MEMORY_BUDGET (bytes: the harness's --memory-budget).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

cases=("$@")
((${#cases[@]})) || cases=(backfill txn)
for c in "${cases[@]}"; do
    [[ $c == backfill || $c == txn ]] || pg_die "usage: $0 [backfill|txn]..."
done

pg_ensure_packages
pipeline=$(pg_build_harness "$root")


pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
pg_log "load average at start (1, 5, 15 min): $(pg_load) on $(nproc) cores"

# Starts the harness on a new slot (args: the joiners policy, the case's name); sets $pid.
start_pipeline() {
    rm -rf "$PG_TMP/out"
    pg_psql -Atc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" >/dev/null
    "$pipeline" --source "$url" --slot lanestream --joiners "$1" --create-slot --sinks 3 \
        --out "$PG_TMP/out" --quiet --summary-json "$PG_TMP/$2.json" \
        ${MEMORY_BUDGET:+--memory-budget "$MEMORY_BUDGET"} >"$PG_TMP/$2.out" 2>&1 &
    pid=$!
    local i
    for i in $(seq 1 300); do
        [[ $(pg_psql -Atc "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'lanestream' AND active") == 1 ]] && return
        kill -0 "$pid" 2>/dev/null || { cat "$PG_TMP/$2.out" >&2; pg_die "the pipeline ended before streaming"; }
        sleep 0.1
    done
    pg_die "the pipeline did not start streaming within 30 s"
}

# Waits until every sink's file has at least $1 lines and the slot confirmed past now, then
# stops the pipeline and prints its peak RSS against the target ($2: name, $3: target MiB).
finish() {
    local want=$1 name=$2 target=$3 end i n
    end=$(pg_psql -Atc "SELECT pg_current_wal_lsn()")
    for i in $(seq 1 3000); do
        n=$(for f in "$PG_TMP"/out/*.ndjson; do wc -l <"$f"; done | sort -n | head -1)
        if ((${n:-0} >= want)) &&
            [[ $(pg_psql -Atc "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'lanestream'") == t ]]; then
            break
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$PG_TMP/$name.out" >&2; pg_die "the pipeline ended early"; }
        sleep 0.2
    done
    ((i < 3000)) || pg_die "$name: the sinks hold $n lines after 10 min, $want expected"
    kill -TERM "$pid"
    wait "$pid" || { cat "$PG_TMP/$name.out" >&2; pg_die "the pipeline failed"; }
    local peak
    peak=$(pg_summary_field "$PG_TMP/$name.json" '"%.1f" % (s["peak_rss_bytes"] / 1048576)')
    pg_log "$name: peak RSS $peak MiB (target <= $target MiB); every sink holds >= $want lines; load $(pg_load)"
}

backfill() {
    local rows=${ROWS:-1000000} rate=${PROBE_RATE:-500}
    pg_psql >/dev/null <<SQL
DROP TABLE IF EXISTS big, probe; DROP PUBLICATION IF EXISTS lanestream;
CREATE TABLE big (id int8 PRIMARY KEY, n int, t text, x numeric, b bool);
INSERT INTO big SELECT g, g % 1000, md5(g::text), g / 7.0, g % 2 = 0 FROM generate_series(1, $rows) g;
CREATE TABLE probe (id bigserial PRIMARY KEY, v int);
SQL
    start_pipeline backfill backfill
    echo 'INSERT INTO probe (v) VALUES (1);' >"$PG_TMP/probe.sql"
    local secs=20 probes
    pg_log "backfill: $rows rows to 3 new sinks, pgbench inserting $rate/s into another table for $secs s beside it"
    "$PG_BIN/pgbench" -n -f "$PG_TMP/probe.sql" --rate "$rate" -T "$secs" -c 2 -j 1 \
        -h 127.0.0.1 -p "$PGPORT" -U postgres postgres >"$PG_TMP/pgbench.out" 2>&1 || {
        cat "$PG_TMP/pgbench.out" >&2
        pg_die "pgbench failed"
    }
    probes=$(pg_psql -Atc "SELECT count(*) FROM probe")
    finish $((rows + probes)) backfill 64
}

txn() {
    local rows=${TXN_ROWS:-2000000}
    pg_psql -c "DROP TABLE IF EXISTS big, probe; DROP PUBLICATION IF EXISTS lanestream; CREATE TABLE big (id int8 PRIMARY KEY, n int, t text)" >/dev/null
    start_pipeline live-only txn
    pg_log "txn: one transaction of $rows inserts to 3 sinks"
    pg_psql -c "INSERT INTO big SELECT g, g % 1000, md5(g::text) FROM generate_series(1, $rows) g" >/dev/null
    finish "$rows" txn 48
}

for c in "${cases[@]}"; do
    "$c"
done
