#!/usr/bin/env bash
# Backlog drain, side by side on one throwaway PostgreSQL 15 (scripts/pg-common.sh): the live
# pipeline (pgoutput streaming source, 3 sinks, --discard) against pg_recvlogical, each draining
# the same backlog from its own slot of the same plugin (pgoutput, one publication FOR ALL
# TABLES) to the end of the WAL, **both on the same transport**: the unix socket (how a pipeline
# on the database's own host connects) and TCP loopback. The server's decoding is the floor; the
# ratio is pg_recvlogical's time over the pipeline's (1.0x: as fast).
#
# The backlog: TXNS transactions of ROWS_PER_TXN inserts each (default 500 x 1000 = 500k), written
# before either reader starts. Each reader runs ROUNDS times (default 3) per transport on a fresh
# slot pair created at the same position (the backlog is written after the slots exist, so all
# decode the same transactions); the best time of each is reported, with the ratio, and for the
# pipeline (and pg_recvlogical, in parentheses) its CPU time per change (user + system) and its context switches per 1,000 changes
# (voluntary + involuntary, /usr/bin/time), in the round of its best time.
#
# Usage: scripts/backlog-drain.sh
#   Env: TXNS, ROWS_PER_TXN, ROUNDS; TRANSPORTS ("unix tcp" by default); PIPELINE (a harness
#   binary to measure instead of this checkout's); BASELINE (a second harness binary, measured in
#   the same rounds: a before/after pair from one run). Not run by CI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"
txns=${TXNS:-500}
rows_per_txn=${ROWS_PER_TXN:-1000}
rounds=${ROUNDS:-3}
transports=${TRANSPORTS:-unix tcp}

pg_ensure_packages
if [[ -z ${PIPELINE:-} ]]; then
    pg_log "building the pipeline harness, the lanestream-pipeline binary (lanestream-postgres, release)"
    (cd "$root" && cargo build --release --quiet -p lanestream-postgres --bin lanestream-pipeline)
    target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    PIPELINE=$target_dir/release/lanestream-pipeline
fi

pg_start
pg_psql >/dev/null <<'SQL'
CREATE TABLE backlog (id bigint PRIMARY KEY, n int, v text, at timestamptz DEFAULT now());
CREATE PUBLICATION lanestream FOR ALL TABLES;
SQL

now_s() { date +%s.%N; }
calc() { python3 -c "print($*)"; }
changes=$((txns * rows_per_txn))
declare -A best best_cpu best_cs best_rss
# One timed run of a command: its wall time into $elapsed, its rusage into $cpu (s), $cs and $rss (kB).
timed() {
    local start
    start=$(now_s)
    /usr/bin/time -f "%U %S %c %w %M" -o "$PG_TMP/rusage" "$@" >"$PG_TMP/run.out" 2>&1 || {
        cat "$PG_TMP/run.out" >&2
        pg_die "failed: $*"
    }
    elapsed=$(calc "$(now_s) - $start")
    read -r user sys invol vol rss <"$PG_TMP/rusage"
    cpu=$(calc "$user + $sys")
    cs=$((invol + vol))
}
note() { # KEY: keeps the best time of KEY, with its CPU and context switches
    if [[ -z ${best[$1]:-} ]] || [[ $(calc "$elapsed < ${best[$1]}") == True ]]; then
        best[$1]=$elapsed
        best_cpu[$1]=$cpu
        best_cs[$1]=$cs
        best_rss[$1]=$rss
    fi
}
readers=(pipeline)
[[ -n ${BASELINE:-} ]] && readers+=(baseline)
for transport in $transports; do
    if [[ $transport == unix ]]; then
        url="host=$PG_TMP port=$PGPORT user=postgres dbname=postgres"
        recv_host=$PG_TMP
    else
        url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
        recv_host=127.0.0.1
    fi
    for round in $(seq 1 "$rounds"); do
        pg_psql -c "TRUNCATE backlog" >/dev/null
        pg_psql -Atc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" >/dev/null
        for slot in recv "${readers[@]}"; do
            pg_psql -Atc "SELECT 1 FROM pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
        done
        pg_psql -v txns="$txns" -v rows="$rows_per_txn" >/dev/null <<'SQL'
SELECT format('INSERT INTO backlog (id, n, v) SELECT g, g %% 1000, ''row '' || g FROM generate_series(%s, %s) g;',
              t * :rows + 1, (t + 1) * :rows)
FROM generate_series(0, :txns - 1) t \gexec
SQL
        end=$(pg_psql -Atc "SELECT pg_current_wal_flush_lsn()")
        timed "$PG_BIN/pg_recvlogical" --start --host="$recv_host" --port="$PGPORT" --dbname="$PGDATABASE" --slot=recv \
            --no-loop --endpos="$end" -o proto_version=1 -o publication_names=lanestream -f /dev/null
        note "$transport recv"
        line="round $round ($transport): pg_recvlogical $(printf %.2f "$elapsed") s"
        for reader in "${readers[@]}"; do
            binary=$PIPELINE
            [[ $reader == baseline ]] && binary=$BASELINE
            timed "$binary" --source "$url" --slot "$reader" --joiners live-only --discard --quiet --sinks 3 \
                --end-lsn "$end" --status-interval-ms 100 --summary-json "$PG_TMP/drain.json"
            published=$(sed -n 's/^  "changes_published": \([0-9]*\),*$/\1/p' "$PG_TMP/drain.json")
            [[ $published -eq $changes ]] || pg_die "$reader published $published changes, not $changes"
            note "$transport $reader"
            line+=", $reader $(printf %.2f "$elapsed") s"
        done
        pg_log "$line"
    done
done
for transport in $transports; do
    for reader in "${readers[@]}"; do
        key="$transport $reader"
        pg_log "$changes inserts in $txns transactions over $transport, best of $rounds: pg_recvlogical $(printf %.2f "${best[$transport recv]}") s, $reader $(printf %.2f "${best[$key]}") s: $(calc "round(${best[$transport recv]} / ${best[$key]}, 2)")x of pg_recvlogical; $reader CPU $(calc "round(${best_cpu[$key]} * 1e6 / $changes, 2)") us per change, $(calc "round(${best_cs[$key]} * 1000 / $changes, 1)") context switches per 1,000 changes (pg_recvlogical: $(calc "round(${best_cpu[$transport recv]} * 1e6 / $changes, 2)") us, $(calc "round(${best_cs[$transport recv]} * 1000 / $changes, 1)")), peak RSS $((best_rss[$key] / 1024)) MiB"
    done
done
