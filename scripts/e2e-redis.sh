#!/usr/bin/env bash
# The pipeline over Redis as separate processes: the pipeline harness (the lanestream-pipeline binary) on the bundled capture with
# the ingest engine and three sink engines (search, cache, archive) each in its own process
# (`--backend URL --role ingest|sink`), sharing one Redis stream, on a redis-server of the
# script's own with persistence (`appendonly yes`, a temp dir, a unix socket). Mid-run the server
# is restarted (SHUTDOWN, started again on the same socket and dir): every process rides the
# outage out within its retry budget (its claims stay its own, its deliveries acknowledgeable).
# The archive sink is slowed down, SIGKILLed mid-run (once its durable checkpoint shows progress) and restarted: it
# re-attaches and gets its unacked batches again. The ingest, held back meanwhile by the
# archive lane's bound, is SIGKILLed too and restarted: its fan-out resumes after the batches
# the log holds. The ingest waits until the watermark is the last commit LSN, then checks every sink's
# output: every published envelope exactly once (`lost 0`). Prints the processes' reports and a PASS or FAIL line last; exits non-zero on
# failure (keeping the work directory for a look).
#
# Then it runs scripts/e2e-redis-outages.sh: the same pipeline, each process supervised, through a
# 0.3 s and a 6 s outage of the server and 2 s of refused writes (OOM), every sink's whole output
# compared with the input's (the pipeline's rule P8).
#
#   scripts/e2e-redis.sh    (starts its own redis-servers; LANESTREAM_REDIS_URL is not used)
#
# Uses the release build of the lanestream-pipeline binary (built here if needed; CI has built it in the
# examples step, with --bins). About 40-60 s in all.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/lanestream-e2e-redis.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    if [ -f "$work/redis.pid" ]; then
        local pid
        pid=$(cat "$work/redis.pid")
        kill "$pid" 2>/dev/null || true
        # Wait until it has exited: it may still write into the work directory while it stops.
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
    echo "FAIL: e2e over Redis: $1 (work directory kept: $work)"
    exit 1
}

command -v redis-server >/dev/null || fail "no redis-server to start"
start_redis() { # with persistence, on the same socket and dir each time; waits until it answers
    redis-server --port 0 --unixsocket "$work/redis.sock" --unixsocketperm 700 --save "" \
        --appendonly yes --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log" --dir "$work"
    for _ in $(seq 100); do
        [ "$(redis-cli -s "$work/redis.sock" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.05
    done
    fail "redis-server did not answer PONG in 5 s"
}
restart_redis() { # SHUTDOWN (the append-only file flushed), then start it again
    local pid
    pid=$(cat "$work/redis.pid")
    redis-cli -s "$work/redis.sock" shutdown >/dev/null 2>&1 || true
    # Redis removes its pid file last, when it has flushed the append-only file and is exiting
    # (the daemon's process may linger as a zombie where nothing reaps it).
    for _ in $(seq 250); do [ -e "$work/redis.pid" ] || break; sleep 0.02; done
    [ -e "$work/redis.pid" ] && fail "redis-server (pid $pid) did not stop on SHUTDOWN in 5 s"
    start_redis
}
start_redis
url="redis+unix://$work/redis.sock"

cargo build --quiet --release -p lanestream-postgres --bin lanestream-pipeline
bin="${CARGO_TARGET_DIR:-target}/release/lanestream-pipeline"
out="$work/out"
# Chunks of 5 changes: the sink SIGKILL below lands in the middle of large transactions (C1).
common=(--backend "$url" --stream-name "e2e_redis_$$" --out "$out" --quiet --max-batch-changes 5)
"$bin" "${common[@]}" --role delete >/dev/null # a fresh stream

start=$(date +%s)
sink() { # sink NAME LOG [extra args]: starts a sink process, records its pid in $last
    local name="$1" log="$2"
    shift 2
    "$bin" "${common[@]}" --role sink --lane "$name" "$@" >"$log" 2>&1 &
    last=$!
    pids+=("$last")
}
sink search "$work/search.log"
sink cache "$work/cache.log"
cache_first=$last
# The victim: 1 ms per batch, so that the run lasts long enough to kill it in the middle.
sink archive "$work/archive-1.log" --slow-sink --slow-sink-micros 1000
victim=$last
"$bin" "${common[@]}" --role ingest --wait-secs 120 >"$work/ingest-1.log" 2>&1 &
ingest=$!
pids+=("$ingest")

progress() { # the output length in the victim's checkpoint (first line "ndjson 2 LENGTH", then the state), 0 before the first
    local c
    c=$(awk 'NR == 1 && $1 == "ndjson" {print $3}' "$out/archive.checkpoint" 2>/dev/null || true)
    echo "$c" | grep -E '^[0-9]+$' || echo 0
}
# Restart Redis once the victim's checkpoint covers 300 kB: every process is mid-run then.
for _ in $(seq 600); do [ "$(progress)" -ge 300000 ] && break; sleep 0.05; done
[ "$(progress)" -ge 300000 ] || fail "the archive sink's checkpoint did not reach 300 kB of output in 30 s"
restart_started=$(date +%s.%N)
at=$(progress)
restart_redis
echo "redis-server restarted (appendonly yes) mid-run at checkpoint $at bytes, in $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $restart_started }") s (stop, start, load)"
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || fail "process $pid ended at the Redis restart"; done
# Kill the victim once its durable checkpoint covers 1 MB of output (of about 10), 0.2-0.7 s later.
for _ in $(seq 600); do [ "$(progress)" -ge 1000000 ] && break; sleep 0.05; done
[ "$(progress)" -ge 1000000 ] || fail "the archive sink's checkpoint did not reach 1 MB of output in 30 s"
sleep "0.$(( RANDOM % 6 + 2 ))"
kill -0 "$victim" 2>/dev/null || fail "the archive sink ended before it could be killed mid-run"
kill -9 "$victim"
wait "$victim" 2>/dev/null || true
cp_len=$(progress)
echo "archive sink SIGKILLed at checkpoint $cp_len bytes durable ($(wc -c <"$out/archive.ndjson") written), state $(sed -n 2p "$out/archive.checkpoint" | cut -c1-200)"
# The ingest: waiting on the archive lane, which is full (capacity 1024) while its sink is dead.
kill -0 "$ingest" 2>/dev/null || fail "the ingest ended while the archive sink was dead"
kill -9 "$ingest"
wait "$ingest" 2>/dev/null || true
first_ingest=$ingest
echo "ingest SIGKILLed (held back by the archive lane's bound)"
"$bin" "${common[@]}" --role ingest --wait-secs 120 >"$work/ingest.log" 2>&1 &
ingest=$!
pids+=("$ingest")
sleep 0.5
sink archive "$work/archive-2.log"
restarted=$last
# A second sink engine for the cache lane while the first still runs (an operator's double
# start): it claims the lane (fencing the first) and then waits for the output's lock, which the
# first lets go when it finds itself fenced; nothing the first writes after that can land
# (contract C1, one writer per output). The ingest's check below reads the output back.
sink cache "$work/cache-2.log"
cache_second=$last

ingest_rc=0
wait "$ingest" || ingest_rc=$?
sinks_rc=0
for pid in "${pids[@]}"; do
    [ "$pid" = "$ingest" ] || [ "$pid" = "$victim" ] || [ "$pid" = "$first_ingest" ] && continue
    if [ "$pid" = "$cache_first" ]; then
        # Fenced by the second engine: it must stop (with an error) rather than go on writing.
        if wait "$pid"; then cache_first_rc=0; else cache_first_rc=$?; fi
        continue
    fi
    wait "$pid" || sinks_rc=$?
done
pids=()
cat "$work/search.log" "$work/cache.log" "$work/cache-2.log" "$work/archive-1.log" "$work/archive-2.log" "$work/ingest-1.log" "$work/ingest.log"
"$bin" "${common[@]}" --role delete >/dev/null
[ "$sinks_rc" = 0 ] || fail "a sink process failed (exit $sinks_rc)"
[ "$cache_first_rc" != 0 ] || fail "the first cache sink engine ran to the end after a second one took its lane"
grep -q 'redeliveries' "$work/cache-2.log" || fail "the second cache sink engine did not report"
[ "$ingest_rc" = 0 ] || fail "the ingest process failed (exit $ingest_rc)"
grep -q '^lost 0,' "$work/ingest.log" || fail "the ingest's check did not report lost 0"
grep -q 'redeliveries' "$work/archive-2.log" || fail "the restarted archive sink did not report"
grep -q 'published by an earlier run' "$work/ingest.log" || fail "the restarted ingest did not report"
# Killed mid-run: the first ingest had published some batches, and left some to the second.
grep -qE '^ingest: [0-9]+ transactions read, [1-9][0-9]* batches published once to each of [0-9]+ lanes \([1-9][0-9]* published by an earlier run\)' \
    "$work/ingest.log" || fail "the ingest was not killed in the middle of publishing"
echo "PASS: e2e over Redis: 3 sink processes and the ingest process, Redis restarted (with persistence) mid-run, the archive sink (pid $victim then $restarted) and the ingest (pid $first_ingest then $ingest) SIGKILLed mid-run and restarted, a second cache sink engine started beside the first (the first stopped, fenced): lost 0, final watermark = last commit LSN, every output exactly once ($(( $(date +%s) - start )) s)"
cleanup  # stop the server before its pid file goes with the work directory
rm -rf "$work" || true
trap - EXIT
scripts/e2e-redis-outages.sh
