#!/usr/bin/env bash
# The log's crash test: a child process appends to a durable log (4 threads, some appends
# conditional: unique slots and an optimistic counter) and prints every acknowledged append; it is
# SIGKILLed at a random moment, then the log is reopened and checked: every acknowledged append
# present byte for byte at its position, the log dense from 1, every event one that was appended,
# every append whole (no torn record, no phantom), no slot claimed twice, the counter exact. Then
# the next cycle appends to the same log. Four cycles in five kill 20-400 ms after the child has
# recovered and started appending; the fifth kills at a random moment after start, often in the
# middle of recovery. The child's segments are small (16 KiB), so it seals one every few dozen
# appends and writes its index file (a temporary file, fsynced, renamed, the directory fsynced):
# kills land in segment writes and in index writes (counted: a kill that left a half-written
# `.idx.tmp` behind). The checker then also deletes every index file and reopens: the log read
# through the index files must equal a scan of every segment. A read-only follower runs in a
# process of its own through every cycle (every writer's kill and restart); at the end it must
# have delivered exactly the recovered log: positions 1, 2, ... in order, byte-keyed, nothing
# the writer had not made durable, nothing missed, no repeat.
#   scripts/log-crash.sh            20 cycles (CI)
#   scripts/log-crash.sh --full     200 cycles
#   scripts/log-crash.sh --cycles N
# Uses the release build of log/tests/crash/child.rs (the example target `log_crash_child`; built
# here if needed; CI has built it in the examples step). Prints a PASS or FAIL line last; exits non-zero on failure, keeping the log
# directory for a look.
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=20
while [ $# -gt 0 ]; do
    case "$1" in
        --full) cycles=200 ;;
        --cycles) cycles="$2"; shift ;;
        *) echo "usage: $0 [--full | --cycles N]" >&2; exit 2 ;;
    esac
    shift
done
cargo build --quiet --release -p lanestream-log --example log_crash_child
bin="${CARGO_TARGET_DIR:-target}/release/examples/log_crash_child"
work=$(mktemp -d "${TMPDIR:-/tmp}/lanestream-log-crash.XXXXXX")
dir="$work/log" acks="$work/acks.txt"
: > "$acks"
opens() { grep -c '^open ' "$acks" || true; }
fail() {
    echo "FAIL: log crash test, cycle $cycle: $1 (log kept in $work)"
    exit 1
}
start=$(date +%s)
mkdir -p "$dir"
"$bin" follow "$dir" "$work/follow.txt" 2> "$work/follow.err" &
follower=$!
stop_follower() { kill -KILL "$follower" 2>/dev/null || true; wait "$follower" 2>/dev/null || true; }
trap stop_follower EXIT
during_recovery=0
during_index=0
for cycle in $(seq 1 "$cycles"); do
    before=$(opens)
    "$bin" append "$dir" "$cycle" >> "$acks" 2> "$work/child.err" &
    pid=$!
    if [ $(( RANDOM % 5 )) -eq 0 ]; then
        sleep "$(printf '0.%03d' $(( RANDOM % 300 )))"
        [ "$(opens)" -gt "$before" ] || during_recovery=$(( during_recovery + 1 ))
    else
        waited=0
        while [ "$(opens)" -le "$before" ]; do
            kill -0 "$pid" 2>/dev/null || { cat "$work/child.err"; fail "the child exited before it opened the log"; }
            sleep 0.01
            waited=$(( waited + 1 ))
            [ "$waited" -lt 6000 ] || fail "the child did not open the log within a minute"
        done
        sleep "$(printf '0.%03d' $(( RANDOM % 380 + 20 )))"
    fi
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if compgen -G "$dir/*.idx.tmp" >/dev/null; then during_index=$(( during_index + 1 )); fi
    if grep -q . "$work/child.err"; then
        cat "$work/child.err"
        fail "the child wrote to stderr"
    fi
    if ! out=$("$bin" verify "$dir" "$acks"); then
        echo "$out"
        fail "the reopened log does not hold what was acknowledged"
    fi
    if [ $(( cycle % 10 )) -eq 0 ] || [ "$cycle" -eq "$cycles" ]; then
        echo "cycle $cycle: $out"
    fi
done
kill -0 "$follower" 2>/dev/null || { cat "$work/follow.err"; fail "the follower exited"; }
if ! follow_out=$("$bin" follow-check "$dir" "$work/follow.txt"); then
    echo "$follow_out"
    fail "the follower's view differs from the log"
fi
stop_follower
if grep -q . "$work/follow.err"; then
    cat "$work/follow.err"
    fail "the follower wrote to stderr"
fi
echo "PASS: log crash test, $cycles SIGKILL cycles ($during_recovery during recovery, $during_index during an index write) in $(( $(date +%s) - start ))s: ${out#ok: }; ${follow_out#ok: }"
rm -rf "$work"
