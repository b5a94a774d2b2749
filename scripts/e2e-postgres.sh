#!/usr/bin/env bash
# End to end against a real PostgreSQL 15 (Debian packages, installed if missing; a throwaway
# cluster from scripts/pg-common.sh): the crash test of the live source, which streams a pgoutput
# slot (START_REPLICATION) and confirms it with standby status updates at the watermark. The
# reference change list comes from a second slot of the other plugin, wal2json, read by the
# wal2json reader: two decoders of one server's WAL must give the same outputs.
#
# 1. Tables with every kind of row identity: a primary key (`accounts`: inserts, updates, deletes,
#    key changes), no primary key with REPLICA IDENTITY USING INDEX (`keyless`, the issue's case),
#    no key at all with REPLICA IDENTITY FULL (`events`: NULL next to the text 'null'), a TOASTed
#    column left out of most updates (`docs`), a table truncated now and then (`scratch`), and
#    large transactions (`bulk`, published in chunks: --max-batch-changes 2000), and key DDL
#    mid-run (`rekey`: its primary-key column renamed, then the key redefined as (rid, k), while
#    the pipeline runs or lies SIGKILLed).
# 2. Two slots: `lanestream` (pgoutput, publication `lanestream` FOR ALL TABLES), streamed by the
#    pipeline, and `audit` (wal2json), never read until the end.
# 3. Concurrent writers (one psql each) for WRITE_SECONDS, while the pipeline runs in live mode
#    (`--source postgres://... --slot lanestream`, durable NDJSON sinks, one of them slow) and is
#    SIGKILLed at random points and restarted: at least KILLS times. Meanwhile a poller reads
#    pg_replication_slots.confirmed_flush_lsn and then every sink's durable checkpoint; a read
#    where the slot was confirmed past a commit (of the reference change list) that a sink had not
#    durably applied is a violation.
#    One run (the third) is not SIGKILLed: its first sink's engine is killed instead
#    (--kill-sink-after: it dies holding unacked batches and unflushed output, and a new engine
#    re-attaches 1.5 s later), then the run is stopped with SIGTERM; its summary must PASS and show
#    every unacked batch redelivered and the watermark held at the dead sink's last ack meanwhile
#    (the poller checks the slot against the sinks' checkpoints during that run too).
# 3b. After the writers stop: one run during which the server is restarted (`pg_ctl restart -m
#    immediate`) between two bursts of writes: the pipeline must reconnect by itself (from the
#    slot's confirmed position: `reconnects` 1 in its summary), carry on, and PASS at SIGTERM.
# 4. After that: a busy neighbour database. With max_slot_wal_keep_size = 64MB, 192 MB
#    of WAL are written to another database of the server (segment switches and checkpoints) while
#    the pipeline's database is idle: the slot must follow (through the empty batches the live
#    source hands over while idle, which every sink acks) and survive, and the run (stopped with
#    SIGTERM) must PASS. Then the pipeline runs once more to the end of the WAL (--end-lsn) and
#    exits cleanly (its summary must PASS, the slot confirmed at the final watermark, which every
#    sink's state records, never past it).
# 6. At the end, the slot dropped (as an admin would) and a change committed meanwhile: started
#    without --create-slot, the pipeline must refuse, saying the slot does not exist and the sinks
#    need a backfill; started with --create-slot, the pipeline must refuse the slot created over
#    sinks that hold data (the gap error naming both positions), drop it, and never print PASS.
# 5. Checks: every sink's output is byte for byte the reference output (the `audit` slot's full
#    change list run through the same reader), so every committed change is there exactly once,
#    in commit order; every sink's output replayed (upserts merged, deletes, truncates) equals the
#    table contents; the poller saw no violation; the transaction at the confirmed position is
#    the first one PostgreSQL sends again (at least once, absorbed by the checkpoints).
#
# Usage: scripts/e2e-postgres.sh [--full | --million]
#   CI: 10 kills, 40 s of writes (about 2 minutes). --full: 40 kills, 150 s of writes.
#   --million: only a 1,000,000-change transaction through the live source (scripts/e2e-million.sh).
#   Env: KILLS, WRITE_SECONDS, SEED override.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

kills_wanted=${KILLS:-10}
write_seconds=${WRITE_SECONDS:-40}
if [[ ${1:-} == --million ]]; then
    exec "$here/e2e-million.sh"
fi
if [[ ${1:-} == --full ]]; then
    kills_wanted=${KILLS:-40}
    write_seconds=${WRITE_SECONDS:-150}
fi
seed=${SEED:-$RANDOM}
RANDOM=$seed

pg_ensure_packages
pg_log "building the pipeline harness, the lanestream-pipeline binary (lanestream-postgres)"
(cd "$root" && cargo build --release --quiet -p lanestream-postgres --bin lanestream-pipeline)
target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
pipeline=$target_dir/release/lanestream-pipeline

# Flags the live source refuses before connecting: --chaos (its sinks are durable) and --input.
for refused in "--chaos" "--input x.jsonl"; do
    # shellcheck disable=SC2086 # two words: a flag and its value
    if "$pipeline" --source postgres://nobody@127.0.0.1:1/x $refused >"$PG_TMP/refused.out" 2>&1; then
        pg_die "the pipeline accepted --source with $refused"
    fi
    grep -q "cannot be used with" "$PG_TMP/refused.out" || {
        cat "$PG_TMP/refused.out" >&2
        pg_die "no clear error for --source with $refused"
    }
done
helper="python3 $here/e2e_postgres.py"
export PSQL=$PG_BIN/psql

pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
out=$PG_TMP/out
ref=$PG_TMP/ref
mkdir -p "$out" "$ref"
sinks=search,cache,archive
# --joiners live-only: the slot is created below before the tables get a row, so the new sinks of
# the first run need nothing from before it (the default would backfill them: see
# postgres/tests/seams.rs for joiners).
common=(--out "$out" --quiet --max-batch-changes 2000 --slow-sink --slow-sink-micros 500 --joiners live-only)
# The sink-kill run cuts transactions into chunks of 7 changes, so the killed engine dies in the
# middle of one (it acked some of its chunks: contract C1); the output does not depend on chunking.
kill_common=(--out "$out" --quiet --max-batch-changes 7 --slow-sink --slow-sink-micros 500 --joiners live-only)
log() { pg_log "[${SECONDS}s] $*"; }

log "seed $seed: $kills_wanted kills, $write_seconds s of writes"
# The slot below is made while every table is empty, which is what --joiners live-only says (the
# last run compares every sink's whole output with the tables).
pg_psql >/dev/null <<'SQL'
CREATE TABLE accounts (id int PRIMARY KEY, name text, balance int);
CREATE TABLE keyless (email text NOT NULL, name text, balance int);
CREATE UNIQUE INDEX keyless_email ON keyless (email);
ALTER TABLE keyless REPLICA IDENTITY USING INDEX keyless_email;
CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE events (k text, n int, t text);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE scratch (id int PRIMARY KEY, v int);
CREATE TABLE bulk (id int PRIMARY KEY, v text);
CREATE TABLE rekey (id int PRIMARY KEY, k int NOT NULL, v int);
CREATE PUBLICATION lanestream FOR ALL TABLES;
SELECT 1 FROM pg_create_logical_replication_slot('lanestream', 'pgoutput');
SELECT 1 FROM pg_create_logical_replication_slot('audit', 'wal2json');
SQL

# The poller, in the background until the stop file appears.
stopfile=$PG_TMP/stop-poller
$helper poller "$out" "$sinks" "$stopfile" "$PG_TMP/poller.samples" >"$PG_TMP/poller.out" &
poller_pid=$!

# The writers.
writer_pids=()
for kind in accounts keyless docs events scratch bulk rekey; do
    $helper writer "$kind" "$write_seconds" "$((seed + ${#writer_pids[@]}))" |
        "$PG_BIN/psql" -X -q >/dev/null 2>>"$PG_TMP/writers.err" &
    writer_pids+=($!)
done
writers_running() {
    local p
    for p in "${writer_pids[@]}"; do
        if kill -0 "$p" 2>/dev/null; then return 0; fi
    done
    return 1
}

# The pipeline, SIGKILLed at random points and restarted.
kills=0
run=0
confirms=()
sink_kill_run=3
while writers_running || ((kills < kills_wanted)); do
    run=$((run + 1))
    if ((run == sink_kill_run)); then
        # A sink engine killed and re-attached mid-run, then a clean stop (SIGTERM).
        "$pipeline" --source "$url" --slot lanestream "${kill_common[@]}" --kill-sink-after 20 --sink-down-ms 1500 \
            --summary-json "$PG_TMP/run-$run.json" >"$PG_TMP/run-$run.out" 2>&1 &
        pid=$!
        sleep 6
        kill -TERM "$pid"
        wait "$pid" || {
            cat "$PG_TMP/run-$run.out" >&2
            pg_die "the sink-kill run failed (run $run)"
        }
        log "sink-kill run: $(grep killed "$PG_TMP/run-$run.out" || echo 'no sink killed')"
        continue
    fi
    "$pipeline" --source "$url" --slot lanestream "${common[@]}" \
        --summary-json "$PG_TMP/run-$run.json" >"$PG_TMP/run-$run.out" 2>&1 &
    pid=$!
    # 0.3 to 4 s: before its first confirm, mid-peek, mid-publish, mid-fsync...
    sleep "$((RANDOM % 38 / 10 + 0)).$((RANDOM % 10))"
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid" || true
        cat "$PG_TMP/run-$run.out" >&2
        pg_die "the pipeline exited by itself (run $run)"
    fi
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null || true
    kills=$((kills + 1))
    confirms+=("$(pg_psql -Atc "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lanestream'")")
    if ((kills % 5 == 0)); then log "$kills kills, slot confirmed at ${confirms[-1]}"; fi
    if ! writers_running && ((kills >= kills_wanted)); then break; fi
done
wait "${writer_pids[@]}" || true
log "writers done after $kills kills; $(grep -c ERROR "$PG_TMP/writers.err" || true) statements refused by constraints (expected): $(grep ERROR "$PG_TMP/writers.err" | sed 's/ [0-9(].*//' | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
advanced=0
for ((i = 1; i < ${#confirms[@]}; i++)); do
    if [[ ${confirms[i]} != "${confirms[i - 1]}" ]]; then advanced=$((advanced + 1)); fi
done
log "the slot's confirmed position moved between $advanced of $((${#confirms[@]} - 1)) consecutive kills" 

# A server restart mid-stream: the pipeline reconnects by itself and carries on.
"$pipeline" --source "$url" --slot lanestream "${common[@]}" \
    --summary-json "$PG_TMP/restart.json" >"$PG_TMP/restart.out" 2>&1 &
pid=$!
burst() { $helper writer accounts 2 "$((seed + $1))" | "$PG_BIN/psql" -X -q >/dev/null 2>>"$PG_TMP/writers.err" || true; }
burst 100
as_pg "$PG_BIN/pg_ctl" -D "$PG_TMP/data" -l "$PG_TMP/server.log" -m immediate -w -t 60 restart >/dev/null ||
    pg_die "pg_ctl restart failed"
log "server restarted (immediate) under the running pipeline"
burst 101
sleep 3
kill -TERM "$pid" 2>/dev/null || true
restart_ok=1
wait "$pid" || restart_ok=0
restart_reconnects=$(sed -n 's/^  "reconnects": \([0-9]*\),*$/\1/p' "$PG_TMP/restart.json")
log "restart run: reconnects ${restart_reconnects:-?}; $(tail -n 1 "$PG_TMP/restart.out" | cut -c1-100)"

# The neighbour database (its CREATE DATABASE is an empty transaction of ours).
pg_psql -c "CREATE DATABASE neighbour" >/dev/null
pg_psql -d neighbour -c "CREATE TABLE w (a int)" >/dev/null
# The reference: the audit slot's whole change list (our database is quiet from here on; the
# neighbour phase below may invalidate the audit slot, which nothing confirms).
pg_psql -Atc "SELECT data FROM pg_logical_slot_peek_changes('audit', NULL, NULL, 'format-version', '2',
    'include-lsn', 'true', 'include-xids', 'true', 'include-timestamp', 'true', 'include-pk', 'true')" >"$ref/stream.jsonl"

# A busy neighbour database while ours is idle: the slot must follow the WAL and survive
# max_slot_wal_keep_size.
pg_psql -c "ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'" >/dev/null
pg_psql -Atc "SELECT pg_reload_conf()" >/dev/null
"$pipeline" --source "$url" --slot lanestream "${common[@]}" \
    --summary-json "$PG_TMP/neighbour.json" >"$PG_TMP/neighbour.out" 2>&1 &
pid=$!
neighbour_ok=1
for step in $(seq 1 12); do
    written=$(pg_psql -d neighbour -Atc "INSERT INTO w VALUES (1)" -c "SELECT pg_switch_wal()" -c "SELECT pg_current_wal_flush_lsn()" | tail -n 1)
    # The signal: the slot's confirmed_flush_lsn reaching what was written (30 s at most).
    deadline=$((SECONDS + 30))
    # (The pipeline confirms an idle slot one byte short of where the server says it sent
    # everything: an empty batch there, which every sink acks; a commit may start at that point.)
    until [[ $(pg_psql -Atc "SELECT confirmed_flush_lsn >= '$written'::pg_lsn - 1 FROM pg_replication_slots WHERE slot_name = 'lanestream'") == t ]]; do
        if ((SECONDS > deadline)) || ! kill -0 "$pid" 2>/dev/null; then
            log "neighbour step $step: the slot did not follow the WAL to $written"
            neighbour_ok=0
            break 2
        fi
        sleep 0.05
    done
    pg_psql -c CHECKPOINT >/dev/null
done
neighbour_status=$(pg_psql -Atc "SELECT wal_status || ' ' || confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lanestream'")
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" || neighbour_ok=0
pg_psql -c "ALTER SYSTEM RESET max_slot_wal_keep_size" >/dev/null
pg_psql -Atc "SELECT pg_reload_conf()" >/dev/null
log "neighbour: 192 MB of WAL elsewhere; slot $neighbour_status; run: $(tail -n 1 "$PG_TMP/neighbour.out" | cut -c1-100)"

# The last run: up to the end of the WAL, then a clean exit with the final confirm.
end=$(pg_psql -Atc "SELECT pg_current_wal_flush_lsn()")
log "last run, to $end"
"$pipeline" --source "$url" --slot lanestream "${common[@]}" --end-lsn "$end" \
    --summary-json "$PG_TMP/final.json" >"$PG_TMP/final.out" 2>&1 || {
    cat "$PG_TMP/final.out" >&2
    pg_die "the last run failed"
}
log "last run done: $(tail -n 1 "$PG_TMP/final.out" | cut -c1-100)"
touch "$stopfile"
wait "$poller_pid"

# The reference, through the same reader (file input), of the change list taken above.
"$pipeline" --input "$ref/stream.jsonl" --out "$ref" --quiet --key-columns public.keyless=email --max-batch-changes 2000 \
    --summary-json "$ref/summary.json" >"$ref/summary.out" 2>&1 || {
    cat "$ref/summary.out" >&2
    pg_die "the reference run failed"
}

log "reference run done"
# The reference's transactions with changes: pgoutput sends no empty (DDL-only) transaction, so
# the sinks never see those, and the slot passes them only through idle batches (nothing of ours
# there); the checks of positions below are against these.
python3 - "$ref/stream.jsonl" >"$ref/stream.changes.jsonl" <<'PY'
import sys
txn = None
for line in open(sys.argv[1]):
    if line.startswith('{"action":"B"'):
        txn = [line]
    elif txn is not None:
        txn.append(line)
        if line.startswith('{"action":"C"'):
            if any(l.startswith(('{"action":"I"', '{"action":"U"', '{"action":"D"', '{"action":"T"')) for l in txn):
                sys.stdout.write("".join(txn))
            txn = None
PY
# The poller notes a failed read (the server down while it restarts) as a comment whose psql
# message may span lines: only the sample lines count.
grep -E '^[0-9]+ [0-9]+$' "$PG_TMP/poller.samples" >"$PG_TMP/poller.readings" || true
read -r checks violations < <($helper violations "$PG_TMP/poller.readings" "$ref/stream.changes.jsonl" 2>"$PG_TMP/violations.log")
# The tables, as "index<TAB>row".
dump=$PG_TMP/tables.tsv
: >"$dump"
for t in accounts keyless docs events scratch bulk rekey; do
    pg_psql -At -F $'\t' -c "SELECT 'public_$t', row_to_json(x) FROM $t x" >>"$dump"
done

fail=0
check() {
    if eval "$1"; then pg_log "ok: $2"; else
        pg_log "FAILED: $2"
        fail=1
    fi
}
field() { sed -n "s/^  \"$1\": \(.*\)$/\1/p" "$2" | sed 's/,$//'; }
confirmed=$(pg_psql -Atc "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lanestream'")
watermark=$(field final_watermark_lsn "$PG_TMP/final.json" | tr -d '"')
changes=$(field changes_published "$ref/summary.json")
commits=$(grep -c '^{"action":"C"' "$ref/stream.jsonl" || true)
# At least once: the next peek starts with the transaction at the confirmed position.
# (pgoutput's Begin: its final LSN, the commit LSN, in bytes 2-9.)
resent=$(pg_psql -Atc "SELECT ('0/0'::pg_lsn + ('x' || encode(substr(data, 2, 8), 'hex'))::bit(64)::bigint)::text
    FROM pg_logical_slot_peek_binary_changes('lanestream', NULL, 1, 'proto_version', '1', 'publication_names', 'lanestream')
    WHERE get_byte(data, 0) = 66 LIMIT 1")

sink_kill=$(python3 - "$PG_TMP/run-$sink_kill_run.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
k = d["per_sink"][0]["sink_kill"] or {}
lsn = lambda t: int(t.split("/")[0], 16) << 32 | int(t.split("/")[1], 16) if t else 0
ok = (d["result"] == "UNCOMPARED" and k.get("held_unacked", 0) >= 1
      and k["redelivered_after_reattach"] >= k["held_unacked"]
      and lsn(k["max_watermark_while_down"]) <= lsn(k["acked_at_death"]))
print("ok" if ok else "bad", json.dumps(k))
PY
)
check '[[ $sink_kill == ok* ]]' "sink-kill run: the killed sink's unacked batches came again to the re-attached engine, the watermark stayed at its last ack while it was dead, and the run's own checks hold (UNCOMPARED: stopped mid-stream): ${sink_kill#* }"
check '((kills >= kills_wanted))' "$kills SIGKILLs of the live pipeline (wanted $kills_wanted)"
check '((restart_ok)) && [[ ${restart_reconnects:-0} -ge 1 ]] && [[ $(field result "$PG_TMP/restart.json") == \"UNCOMPARED\" ]]' "server restarted mid-stream (pg_ctl restart -m immediate): the pipeline reconnected ${restart_reconnects:-0} times by itself and its own checks hold: $(tail -n 1 "$PG_TMP/restart.out")"
check '[[ $(field result "$PG_TMP/final.json") == \"PASS\" ]]' "the last run PASSes: every sink's whole output equals the tables: $(tail -n 1 "$PG_TMP/final.out")"
last_commit=$(sed -n 's/^{"action":"C".*"lsn":"\([^"]*\)".*/\1/p' "$ref/stream.changes.jsonl" | tail -n 1)
lsn_ge() { [[ $(pg_psql -Atc "SELECT '$1'::pg_lsn >= '$2'::pg_lsn") == t ]]; }
applied=$(for s in ${sinks//,/ }; do $helper applied "$out/$s.checkpoint"; done | sort -u | tr '\n' ' ')
# Every sink's state at the final watermark (the last run's, or, when it had nothing to publish,
# where the runs before left the slot), at or past the last commit (an idle batch may follow it),
# and the slot confirmed exactly there: never past what every sink holds.
final_at=$watermark
[[ $watermark == null ]] && final_at=$confirmed
check '[[ $applied == "$final_at " && $confirmed == "$final_at" ]] && lsn_ge "$final_at" "$last_commit"' "slot confirmed_flush_lsn $confirmed == every sink's state ($applied) == the final watermark ${watermark/null/(none: nothing new)}, at or past the last commit $last_commit"
check '[[ -z $resent ]] || [[ $resent == "$confirmed" ]]' "after a restart the slot sends again the transaction at the confirmed position, if it is a commit (at least once): ${resent:-nothing (confirmed at an idle batch past the last commit)}"
check '((checks > 50 && violations == 0))' "poller: $violations of $checks reads saw the slot confirmed past a commit a sink had not durably applied"
check '((neighbour_ok)) && [[ $neighbour_status != lost* ]] && [[ $(field result "$PG_TMP/neighbour.json") == \"UNCOMPARED\" ]]' "busy neighbour database (192 MB of WAL, max_slot_wal_keep_size 64MB): the idle slot followed and survived ($neighbour_status), the run's own checks hold"
check '[[ $changes -gt 1000 ]]' "the reference holds $changes changes in $commits transactions"
chunks=$(field chunks_published "$ref/summary.json")
check '[[ $chunks -gt 0 ]]' "large transactions were published in chunks ($chunks chunks at --max-batch-changes 2000)"
without_unchanged() { sed -E 's/,"unchanged":\[[^]]*\]//' "$1"; }
for s in ${sinks//,/ }; do
    # The reference comes through wal2json, which does not say which columns an update left out
    # (pgoutput does: `"unchanged":[...]`, P5): compared without that field, which the replay
    # below applies by the sink rules.
    partial=$(grep -c '"unchanged":\[' "$out/$s.ndjson" || true)
    check 'cmp -s "$ref/$s.ndjson" <(without_unchanged "$out/$s.ndjson")' "sink $s: output == the reference, byte for byte but the $partial partial updates' unchanged columns, which wal2json does not name ($(wc -l <"$out/$s.ndjson") envelopes: every change exactly once, in commit order)"
    check '$helper positions "$out/$s.ndjson" >/dev/null' "sink $s: each transaction once, in commit order"
    check '$helper replay "$out/$s.ndjson" "$dump" >&2' "sink $s: output replayed == the table contents"
done
rekeyed=$(grep -c '"index":"public_rekey"' "$out/search.ndjson" || true)
check '[[ $rekeyed -gt 0 ]] && grep -q "\"index\":\"public_rekey\",\"id\":\"[0-9]*:[12]\"" "$out/search.ndjson"' "key DDL mid-run: $rekeyed envelopes of public.rekey, keyed by (rid, k) after the key was redefined"

# The slot dropped by an admin, a change committed meanwhile: the pipeline must refuse to carry on.
pg_psql -Atc "SELECT pg_drop_replication_slot('lanestream')" >/dev/null
pg_psql -c "INSERT INTO accounts VALUES (999999, 'committed while the slot was gone', 0)" >/dev/null
gap_end=$(pg_psql -Atc "SELECT pg_current_wal_flush_lsn()")
if "$pipeline" --source "$url" --slot lanestream "${common[@]}" --end-lsn "$gap_end" >"$PG_TMP/dropped.out" 2>&1; then
    dropped_rc=0
else
    dropped_rc=$?
fi
check '((dropped_rc != 0)) && grep -q "does not exist" "$PG_TMP/dropped.out" && grep -q backfill "$PG_TMP/dropped.out" && ! grep -q "PASS" "$PG_TMP/dropped.out"' "a dropped slot: the pipeline refuses and says the sinks need a backfill: $(grep error: "$PG_TMP/dropped.out" | cut -c1-160)"
if "$pipeline" --source "$url" --slot lanestream --create-slot "${common[@]}" --end-lsn "$gap_end" >"$PG_TMP/recreated.out" 2>&1; then
    recreated_rc=0
else
    recreated_rc=$?
fi
slot_left=$(pg_psql -Atc "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'lanestream'")
check '((recreated_rc != 0)) && grep -q "past the data of sink" "$PG_TMP/recreated.out" && grep -q "dropped again" "$PG_TMP/recreated.out" && ! grep -q "PASS" "$PG_TMP/recreated.out" && ((slot_left == 0))' "--create-slot over sinks that hold data: the slot created is a gap, refused by the pipeline and dropped again, no PASS, no slot: $(grep error: "$PG_TMP/recreated.out" | cut -c1-200)"

if ((fail)); then
    pg_log "kept for inspection: none (the cluster dir is removed); violations:"
    tail -n 5 "$PG_TMP/violations.log" >&2
    exit 1
fi
log "end to end ok: seed $seed, $kills kills, $commits transactions, $changes changes, $checks confirmed-vs-applied reads"
