#!/usr/bin/env bash
# The pipeline over Redis through outages (issue 33, fault 8; the pipeline's rule P8): the ingest and
# three sink processes (search, cache, archive) of the pipeline harness on the bundled capture
# (`--backend URL --role ingest|sink`), on a redis-server of the script's own with persistence
# (`appendonly yes`, a temp dir, a unix socket). Each process runs under a supervisor loop, as an
# operator's would run it: started again (after 0.5 s) whenever it exits with an error, until it
# exits cleanly (a sink once its lane is closed and drained, the ingest once its check passed).
# Mid-run (keyed to the slowed archive sink's durable checkpoint), in this order:
#
#   1. a short outage: the server is stopped (SHUTDOWN, the append-only file flushed) and started
#      again on the same socket 0.3 s later. Inside the retry budget (5 s): no process may exit.
#   2. a long outage: the same with 6 s, past the retry budget. Processes may exit on it; their
#      supervisors start them again (which fails while the server is down, and is tried again).
#   3. refused writes: `maxmemory` set below the used memory (`noeviction`: every write is
#      refused with OOM) for 2 s, then lifted. Inside the retry budget: no process may exit.
#   4. refused writes for 6 s, past the retry budget: processes may exit, and are started again
#      (which fails while writes are refused, and is tried again).
#
# At the end every sink's whole output must equal the input's (the in-process harness's output for
# the same input, made first): every line exactly once, in order, compared byte for byte; and the
# last ingest must have seen the watermark reach the last commit LSN. A close made by a process
# that exits on an error must not outlive it (a restarted ingest publishes again, P8), and an ack
# whose reply an outage lost must not hold its lane (P8).
#
#   scripts/e2e-redis-outages.sh    (starts its own redis-server; LANESTREAM_REDIS_URL is not used)
#
# Uses the release build of the lanestream-pipeline binary (built here if needed). About 35-45 s;
# a run that wedges is stopped at 100 s (FAIL).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/lanestream-e2e-redis-outages.XXXXXX")
supervisors=()
cleanup() {
    for pid in "${supervisors[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for f in "$work"/*.pid; do
        [ -e "$f" ] || continue
        [ "$f" = "$work/redis.pid" ] && continue
        kill -9 "$(cat "$f")" 2>/dev/null || true
    done
    if [ -f "$work/redis.pid" ]; then
        local pid
        pid=$(cat "$work/redis.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
    echo "FAIL: e2e over Redis with outages: $1 (work directory kept: $work)"
    for log in "$work"/*.log; do
        [ -e "$log" ] || continue
        [ "$log" = "$work/redis.log" ] && continue
        echo "--- $(basename "$log")"
        tail -5 "$log"
    done
    exit 1
}

command -v redis-server >/dev/null || fail "no redis-server to start"
cli() { redis-cli -s "$work/redis.sock" "$@"; }
start_redis() { # with persistence, on the same socket and dir each time; waits until it answers
    redis-server --port 0 --unixsocket "$work/redis.sock" --unixsocketperm 700 --save "" \
        --appendonly yes --daemonize yes --pidfile "$work/redis.pid" --logfile "$work/redis.log" \
        --dir "$work" --maxmemory-policy noeviction
    for _ in $(seq 100); do
        [ "$(cli ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.05
    done
    fail "redis-server did not answer PONG in 5 s"
}
stop_redis() { # SHUTDOWN (the append-only file flushed); waits until the server has exited
    local pid
    pid=$(cat "$work/redis.pid")
    cli shutdown >/dev/null 2>&1 || true
    for _ in $(seq 250); do [ -e "$work/redis.pid" ] || break; sleep 0.02; done
    [ -e "$work/redis.pid" ] && fail "redis-server (pid $pid) did not stop on SHUTDOWN in 5 s"
    return 0
}
now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.2f\", $(now) - $1 }"; }
start_redis
url="redis+unix://$work/redis.sock"

# LANESTREAM_PIPELINE_BIN: another build of the binary to run (e.g. an older one, to compare).
bin="${LANESTREAM_PIPELINE_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --quiet --release -p lanestream-postgres --bin lanestream-pipeline
    bin="${CARGO_TARGET_DIR:-target}/release/lanestream-pipeline"
fi
out="$work/out"
# The input's output, for the final comparison: the in-process harness on the same input (chunks
# of 5 changes), whose sinks each write every envelope once.
"$bin" --out "$work/want" --quiet --max-batch-changes 5 >"$work/want.txt" 2>&1 ||
    fail "the in-process run that makes the expected output failed"
common=(--backend "$url" --stream-name "e2e_redis_outages_$$" --out "$out" --quiet --max-batch-changes 5)
"$bin" "${common[@]}" --role delete >/dev/null # a fresh stream

start=$(now)
deadline=$(( $(date +%s) + 100 ))
# supervise NAME ARGS...: runs the harness with ARGS again after every exit with an error (0.5 s
# later), until it exits 0 or the deadline; its runs' logs are NAME-<run>.log, its current pid
# is in NAME.pid, and the number of its exits with an error in NAME.restarts.
supervise() {
    local name="$1" run=0 rc
    shift
    echo 0 >"$work/$name.restarts"
    while :; do
        "$bin" "${common[@]}" "$@" >"$work/$name-$run.log" 2>&1 &
        echo $! >"$work/$name.pid"
        rc=0
        wait $! || rc=$?
        [ "$rc" = 0 ] && return 0
        run=$((run + 1))
        echo "$run" >"$work/$name.restarts"
        [ "$(date +%s)" -lt "$deadline" ] || return "$rc"
        sleep 0.5
    done
}
supervise search --role sink --lane search &
supervisors+=($!)
supervise cache --role sink --lane cache &
supervisors+=($!)
# 1 ms per batch: the run lasts long enough to put three faults in its middle.
supervise archive --role sink --lane archive --slow-sink --slow-sink-micros 1000 &
supervisors+=($!)
supervise ingest --role ingest --wait-secs 90 &
ingest_supervisor=$!
supervisors+=("$ingest_supervisor")

# At the deadline every process still running is killed (a wedged run ends; its supervisor then
# gives up): the checks below report what was missing.
(
    sleep $(( deadline - $(date +%s) ))
    for name in search cache archive ingest; do kill -9 "$(cat "$work/$name.pid" 2>/dev/null)" 2>/dev/null || true; done
) &
watchdog=$!
supervisors+=("$watchdog")

restarts() { # the exits with an error of every process so far
    local total=0 n
    for name in search cache archive ingest; do
        n=$(cat "$work/$name.restarts" 2>/dev/null || echo 0)
        total=$((total + n))
    done
    echo "$total"
}
progress() { # the output length in the archive sink's checkpoint (first line "ndjson 2 LENGTH", then the state), 0 before the first
    local c
    c=$(awk 'NR == 1 && $1 == "ndjson" {print $3}' "$out/archive.checkpoint" 2>/dev/null || true)
    echo "$c" | grep -E '^[0-9]+$' || echo 0
}
wait_progress() { # wait_progress BYTES WHAT: until the archive's checkpoint covers BYTES (of about 10 MB)
    while [ "$(progress)" -lt "$1" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            failures+=("the archive sink's checkpoint did not reach $1 bytes before $2 ($(restarts) exits with an error so far)")
            return 0
        fi
        sleep 0.05
    done
}
failures=()
settle() { # lets the processes meet the recovered server for a second, then checks none exited
    sleep 1
    [ "$(restarts)" = "$1" ] || failures+=("$2: a process exited inside the retry budget ($(( $(restarts) - $1 )) exits with an error)")
}

# 1. A short outage, inside the retry budget.
wait_progress 1000000 "the short outage"
before=$(restarts)
t=$(now)
stop_redis
sleep 0.3
start_redis
short=$(since "$t")
echo "short outage: redis-server down and back (appendonly yes) in $short s, at archive checkpoint $(progress) bytes"
settle "$before" "the short outage"

# 2. A long outage, past the retry budget: processes may exit, their supervisors start them again.
wait_progress 3000000 "the long outage"
t=$(now)
stop_redis
sleep 6
start_redis
long=$(since "$t")
echo "long outage: redis-server down and back in $long s, at archive checkpoint $(progress) bytes ($(restarts) exits with an error so far)"

# 3. Refused writes (OOM), inside the retry budget; 4. the same past it.
refuse_writes() { # refuse_writes SECONDS: maxmemory below the memory used (noeviction), then lifted
    local used refused
    used=$(cli info memory | awk -F: '/^used_memory:/ { print $2 }' | tr -d '\r')
    cli config set maxmemory 1 >/dev/null
    refused=$(cli set lanestream_e2e_probe 1 2>&1 || true)
    echo "$refused" | grep -q OOM || failures+=("maxmemory below the used memory ($used bytes) did not refuse a write: $refused")
    sleep "$1"
    cli config set maxmemory 0 >/dev/null
    echo "OOM: every write refused for $1 s (maxmemory 1 below $used bytes used, noeviction), then lifted, at archive checkpoint $(progress) bytes ($(restarts) exits with an error so far)"
}
wait_progress 6000000 "the short OOM"
before=$(restarts)
refuse_writes 2
settle "$before" "the short OOM"
wait_progress 8000000 "the long OOM"
refuse_writes 6

# The end: every supervisor returns once its process exited cleanly (or at the deadline).
for pid in "${supervisors[@]}"; do
    [ "$pid" = "$watchdog" ] && continue
    wait "$pid" || failures+=("a process still failed at the deadline (supervisor $pid)")
done
kill "$watchdog" 2>/dev/null || true
supervisors=()
for name in search cache archive ingest; do
    for log in $(ls "$work/$name"-*.log | sort -V); do
        echo "--- $(basename "$log")"
        cat "$log"
    done
done
"$bin" "${common[@]}" --role delete >/dev/null
last_ingest=$(ls "$work"/ingest-*.log | sort -V | tail -1)
grep -q '^PASS' "$last_ingest" || failures+=("the last ingest did not pass its check ($(basename "$last_ingest"))")
missing_total=0
for sink in search cache archive; do
    want=$(wc -l <"$work/want/$sink.ndjson")
    got=$(wc -l <"$out/$sink.ndjson" 2>/dev/null || echo 0)
    if ! cmp -s "$work/want/$sink.ndjson" "$out/$sink.ndjson"; then
        sort "$work/want/$sink.ndjson" >"$work/want.sorted"
        sort "$out/$sink.ndjson" >"$work/got.sorted" 2>/dev/null || : >"$work/got.sorted"
        missing=$(comm -23 "$work/want.sorted" "$work/got.sorted" | wc -l)
        extra=$(comm -13 "$work/want.sorted" "$work/got.sorted" | wc -l)
        missing_total=$((missing_total + missing))
        failures+=("sink $sink: its output ($got lines) is not the input's ($want lines): $missing lines missing, $extra extra or twice")
    fi
done
echo "lines missing: $missing_total; exits with an error: $(restarts)"
if [ "${#failures[@]}" -gt 0 ]; then
    printf '%s\n' "${failures[@]}"
    fail "${#failures[@]} checks failed"
fi
echo "PASS: e2e over Redis with outages: the ingest and 3 sink processes (supervised, $(restarts) exits with an error in all) through a ${short} s outage, a ${long} s outage, and writes refused (OOM) for 2 s and for 6 s: every sink's output is the input's, line for line ($(wc -l <"$out/search.ndjson") lines each), and the last ingest saw the watermark reach the last commit LSN ($(since "$start") s)"
cleanup
rm -rf "$work" || true
