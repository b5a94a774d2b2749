#!/usr/bin/env bash
# Live pipeline latency and slow-sink drain, on a throwaway PostgreSQL 15 (scripts/pg-common.sh).
# Not run by CI (a timing run wants a quiet machine); run it by hand.
#
# Default (the latency test): the live pipeline (pgoutput streaming source, 3 durable NDJSON sinks
# with --out, or --discard with DISCARD=1) follows a steady load of single-row INSERT
# transactions at RATE per second for SECONDS (pgbench --rate, a custom script; default 5,000/s
# for 20 s). When the slot has confirmed everything, the pipeline is stopped (SIGTERM: it drains
# and acks what it published) and its summary gives, per sink, the time from each transaction's
# commit (the commit timestamp of its pgoutput Begin) to that sink's ack, and for the last
# sink's ack. The target: p99 <= P99_TARGET_MS (default 50). Exit status 1 when it is missed.
#
# --slow-sink (the slow sink drain): a backlog of TXNS transactions of ROWS_PER_TXN inserts
# (default 20,000 x 10) is written after two slots are created at the same position; the
# pipeline (3 sinks, --discard) drains it from one with every sink fast, then from the other with
# the last sink sleeping SLOW_MICROS (default 200) per batch. The slow drain must stay within
# 1.2x of (fast drain + the sleeps, TXNS x SLOW_MICROS): re-decoding must not grow with the
# unconfirmed window. Exit status 1 when it does not.
#
# Usage: scripts/latency.sh [--slow-sink]
# Env: RATE, SECONDS_, CLIENTS, P99_TARGET_MS, DISCARD (latency); TXNS, ROWS_PER_TXN, SLOW_MICROS,
# ROUNDS (slow sink: best of ROUNDS, default 2); PIPELINE (a harness built elsewhere, instead of
# this checkout's); PG_TMPDIR (where the cluster and the sinks' output go, default /tmp).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

mode=latency
case "${1:-}" in
    "") ;;
    --slow-sink) mode=slow ;;
    *) pg_die "usage: $0 [--slow-sink]" ;;
esac

pg_ensure_packages
pipeline=$(pg_build_harness "$root")

now_s() { date +%s.%N; }
calc() { python3 -c "print($*)"; }

pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
pg_log "load average at start (1, 5, 15 min): $(pg_load) on $(nproc) cores"

latency() {
    local rate=${RATE:-5000} secs=${SECONDS_:-20} clients=${CLIENTS:-8} target=${P99_TARGET_MS:-50}
    local out=(--out "$PG_TMP/out")
    [[ ${DISCARD:-0} == 1 ]] && out=(--discard)
    pg_psql -c "CREATE TABLE lat (id bigserial PRIMARY KEY, v int NOT NULL, at timestamptz NOT NULL DEFAULT now())" >/dev/null
    # The pipeline creates the publication (for every table) and the slot, then follows the slot;
    # the table is empty then, so its new sinks need no backfill (--joiners live-only).
    "$pipeline" --source "$url" --slot lanestream --joiners live-only --create-slot --sinks 3 "${out[@]}" --quiet \
        --status-interval-ms 100 --summary-json "$PG_TMP/latency.json" >"$PG_TMP/latency.out" 2>&1 &
    local pid=$!
    # An early exit stops the pipeline too (then the cluster, keeping the exit status).
    trap 'rc=$?; set +e; kill -TERM '"$pid"' 2>/dev/null; (exit $rc); pg_cleanup' EXIT
    local i
    for i in $(seq 1 300); do
        [[ $(pg_psql -Atc "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'lanestream' AND active") == 1 ]] && break
        kill -0 "$pid" 2>/dev/null || { cat "$PG_TMP/latency.out" >&2; pg_die "the pipeline ended before streaming"; }
        sleep 0.1
    done
    ((i < 300)) || pg_die "the pipeline did not start streaming within 30 s"
    echo 'INSERT INTO lat (v) VALUES (1);' >"$PG_TMP/insert.sql"
    pg_log "pgbench: single-row INSERT transactions at $rate/s for $secs s ($clients clients), 3 sinks ${out[*]}"
    "$PG_BIN/pgbench" -n -f "$PG_TMP/insert.sql" --rate "$rate" -T "$secs" -c "$clients" -j 2 \
        -h 127.0.0.1 -p "$PGPORT" -U postgres postgres >"$PG_TMP/pgbench.out" 2>&1 || {
        cat "$PG_TMP/pgbench.out" >&2
        pg_die "pgbench failed"
    }
    local load_end end rows
    load_end=$(pg_load)
    end=$(pg_psql -Atc "SELECT pg_current_wal_lsn()")
    rows=$(pg_psql -Atc "SELECT count(*) FROM lat")
    # Wait until the slot confirmed everything (every sink acked it), then stop the pipeline.
    for i in $(seq 1 600); do
        [[ $(pg_psql -Atc "SELECT confirmed_flush_lsn >= '$end' FROM pg_replication_slots WHERE slot_name = 'lanestream'") == t ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || { cat "$PG_TMP/latency.out" >&2; pg_die "the pipeline failed"; }
    grep -E "^(tps|latency average|rate limit schedule lag|number of transactions actually processed)" "$PG_TMP/pgbench.out" |
        sed 's/^/  pgbench: /' >&2
    local published p50 p99 max cps
    published=$(pg_summary_field "$PG_TMP/latency.json" 's["transactions_published"]')
    ((published >= rows)) || pg_die "the pipeline published $published transactions, pgbench committed $rows"
    p50=$(pg_summary_field "$PG_TMP/latency.json" 's["commit_to_last_ack"]["p50_ms"]')
    p99=$(pg_summary_field "$PG_TMP/latency.json" 's["commit_to_last_ack"]["p99_ms"]')
    max=$(pg_summary_field "$PG_TMP/latency.json" 's["commit_to_last_ack"]["max_ms"]')
    cps=$(pg_summary_field "$PG_TMP/latency.json" 's["changes_per_second"]')
    pg_summary_field "$PG_TMP/latency.json" '"\n".join("  sink %s: p50 %.3f ms, p99 %.3f ms, max %.3f ms over %d transactions" % (k["name"], k["commit_to_ack"]["p50_ms"], k["commit_to_ack"]["p99_ms"], k["commit_to_ack"]["max_ms"], k["commit_to_ack"]["samples"]) for k in s["per_sink"])' >&2
    pg_log "$published transactions ($rows rows) through 3 sinks; $cps changes/s over the run; peak RSS $(pg_summary_field "$PG_TMP/latency.json" '"%.1f MiB" % (s["peak_rss_bytes"] / 1048576)'); load average at the end of the load: $load_end"
    pg_summary_field "$PG_TMP/latency.json" '"  of which commit -> decoded (the source: walsender, network, decoder): p50 %.3f ms, p99 %.3f ms, max %.3f ms" % (s["commit_to_decode"]["p50_ms"], s["commit_to_decode"]["p99_ms"], s["commit_to_decode"]["max_ms"])' >&2
    pg_log "commit -> last sink's ack: p50 $p50 ms, p99 $p99 ms, max $max ms (target p99 <= $target ms)"
    if python3 -c "import sys; sys.exit(0 if $p99 <= $target else 1)"; then
        pg_log "PASS: p99 $p99 ms <= $target ms"
    else
        pg_log "FAIL: p99 $p99 ms > $target ms"
        exit 1
    fi
}

slow() {
    local txns=${TXNS:-20000} rows=${ROWS_PER_TXN:-10} micros=${SLOW_MICROS:-200} rounds=${ROUNDS:-2}
    pg_psql >/dev/null <<'SQL'
CREATE TABLE backlog (id bigint PRIMARY KEY, n int, v text);
CREATE PUBLICATION lanestream FOR ALL TABLES;
SQL
    local best_fast='' best_slow='' round
    for round in $(seq 1 "$rounds"); do
        pg_psql -c "TRUNCATE backlog" >/dev/null
        pg_psql -Atc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots" >/dev/null
        pg_psql -Atc "SELECT 1 FROM pg_create_logical_replication_slot('fast', 'pgoutput')" >/dev/null
        pg_psql -Atc "SELECT 1 FROM pg_create_logical_replication_slot('slow', 'pgoutput')" >/dev/null
        pg_psql -v txns="$txns" -v rows="$rows" >/dev/null <<'SQL'
SET lanestream.txns = :txns;
SET lanestream.rows = :rows;
DO $$
DECLARE n int := current_setting('lanestream.txns')::int; r int := current_setting('lanestream.rows')::int;
BEGIN
  FOR t IN 0..n - 1 LOOP
    INSERT INTO backlog SELECT g, g % 1000, 'row ' || g FROM generate_series(t * r + 1, (t + 1) * r) g;
    COMMIT;
  END LOOP;
END $$;
SQL
        local end start fast slowt
        end=$(pg_psql -Atc "SELECT pg_current_wal_flush_lsn()")
        start=$(now_s)
        "$pipeline" --source "$url" --slot fast --joiners live-only --discard --quiet --sinks 3 --end-lsn "$end" --status-interval-ms 100 \
            --summary-json "$PG_TMP/fast.json" >"$PG_TMP/fast.out" 2>&1 || { cat "$PG_TMP/fast.out" >&2; pg_die "the fast run failed"; }
        fast=$(calc "$(now_s) - $start")
        start=$(now_s)
        "$pipeline" --source "$url" --slot slow --joiners live-only --discard --quiet --sinks 3 --end-lsn "$end" --status-interval-ms 100 \
            --slow-sink --slow-sink-micros "$micros" \
            --summary-json "$PG_TMP/slow.json" >"$PG_TMP/slow.out" 2>&1 || { cat "$PG_TMP/slow.out" >&2; pg_die "the slow run failed"; }
        slowt=$(calc "$(now_s) - $start")
        local f s
        f=$(pg_summary_field "$PG_TMP/fast.json" 's["transactions_published"]')
        s=$(pg_summary_field "$PG_TMP/slow.json" 's["transactions_published"]')
        ((f == txns && s == txns)) || pg_die "published $f (fast) and $s (slow) transactions, not $txns"
        pg_log "round $round: fast drain $(printf %.2f "$fast") s, slow drain $(printf %.2f "$slowt") s ($txns transactions of $rows rows, load $(pg_load))"
        best_fast=$(calc "min($fast, ${best_fast:-$fast})")
        best_slow=$(calc "min($slowt, ${best_slow:-$slowt})")
    done
    local sleeps bound ratio
    sleeps=$(calc "$txns * $micros / 1e6")
    bound=$(calc "1.2 * ($best_fast + $sleeps)")
    ratio=$(calc "round($best_slow / ($best_fast + $sleeps), 2)")
    pg_log "best of $rounds: fast $(printf %.2f "$best_fast") s, slow $(printf %.2f "$best_slow") s; sleeps $(printf %.2f "$sleeps") s ($txns x $micros us): slow / (fast + sleeps) = ${ratio}x (target <= 1.2x, bound $(printf %.2f "$bound") s)"
    if python3 -c "import sys; sys.exit(0 if $best_slow <= $bound else 1)"; then
        pg_log "PASS"
    else
        pg_log "FAIL: the slow drain exceeds 1.2x of (fast drain + sleeps)"
        exit 1
    fi
}

if [[ $mode == latency ]]; then latency; else slow; fi
