#!/usr/bin/env bash
# Backlog drain, side by side on one throwaway PostgreSQL 15 (scripts/pg-common.sh): the live
# pipeline (pgoutput streaming source, 3 sinks, --discard) against pg_recvlogical, each draining
# the same backlog from its own slot of the same plugin (pgoutput, one publication FOR ALL
# TABLES) to the end of the WAL. The server's decoding is the floor; the ratio is
# pg_recvlogical's time over the pipeline's (1.0x: as fast; the goal is >= 0.8x).
#
# The backlog: TXNS transactions of ROWS_PER_TXN inserts each (default 500 x 1000 = 500k), written
# before either reader starts. Each reader runs ROUNDS times (default 3) on a fresh slot pair
# created at the same position (the backlog is written after both slots exist, so both decode
# the same transactions); the best time of each is reported, with the ratio.
#
# Usage: scripts/backlog-drain.sh   Env: TXNS, ROWS_PER_TXN, ROUNDS. Not run by CI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"
txns=${TXNS:-500}
rows_per_txn=${ROWS_PER_TXN:-1000}
rounds=${ROUNDS:-3}

pg_ensure_packages
pg_log "building the pipeline harness, the lanestream-pipeline binary (lanestream-postgres, release)"
(cd "$root" && cargo build --release --quiet -p lanestream-postgres --bin lanestream-pipeline)
target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
pipeline=$target_dir/release/lanestream-pipeline

pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
pg_psql >/dev/null <<'SQL'
CREATE TABLE backlog (id bigint PRIMARY KEY, n int, v text, at timestamptz DEFAULT now());
CREATE PUBLICATION lanestream FOR ALL TABLES;
SQL

now_s() { date +%s.%N; }
calc() { python3 -c "print($*)"; }
best_recv=
best_pipe=
for round in $(seq 1 "$rounds"); do
    pg_psql -c "TRUNCATE backlog" >/dev/null
    pg_psql -Atc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" >/dev/null
    pg_psql -Atc "SELECT 1 FROM pg_create_logical_replication_slot('lanestream', 'pgoutput')" >/dev/null
    pg_psql -Atc "SELECT 1 FROM pg_create_logical_replication_slot('recv', 'pgoutput')" >/dev/null
    pg_psql -v txns="$txns" -v rows="$rows_per_txn" >/dev/null <<'SQL'
SELECT format('INSERT INTO backlog (id, n, v) SELECT g, g %% 1000, ''row '' || g FROM generate_series(%s, %s) g;',
              t * :rows + 1, (t + 1) * :rows)
FROM generate_series(0, :txns - 1) t \gexec
SQL
    end=$(pg_psql -Atc "SELECT pg_current_wal_flush_lsn()")
    start=$(now_s)
    "$PG_BIN/pg_recvlogical" --start --host=127.0.0.1 --port="$PGPORT" --dbname="$PGDATABASE" --slot=recv --no-loop --endpos="$end" \
        -o proto_version=1 -o publication_names=lanestream -f /dev/null
    recv=$(calc "$(now_s) - $start")
    start=$(now_s)
    "$pipeline" --source "$url" --slot lanestream --discard --quiet --sinks 3 --end-lsn "$end" --status-interval-ms 100 \
        --summary-json "$PG_TMP/drain.json" >"$PG_TMP/drain.out" 2>&1 || {
        cat "$PG_TMP/drain.out" >&2
        pg_die "the pipeline failed"
    }
    pipe=$(calc "$(now_s) - $start")
    changes=$(sed -n 's/^  "changes_published": \([0-9]*\),*$/\1/p' "$PG_TMP/drain.json")
    [[ $changes -eq $((txns * rows_per_txn)) ]] || pg_die "the pipeline published $changes changes, not $((txns * rows_per_txn))"
    pg_log "round $round: pg_recvlogical $(printf %.2f "$recv") s, pipeline $(printf %.2f "$pipe") s ($changes changes, 3 sinks)"
    best_recv=$(calc "min($recv, ${best_recv:-$recv})")
    best_pipe=$(calc "min($pipe, ${best_pipe:-$pipe})")
done
pg_log "backlog of $((txns * rows_per_txn)) inserts in $txns transactions: best of $rounds: pg_recvlogical $(printf %.2f "$best_recv") s, pipeline $(printf %.2f "$best_pipe") s: the pipeline at $(calc "round($best_recv / $best_pipe, 2)")x of pg_recvlogical"
