#!/usr/bin/env bash
# The log's crash test: a child process appends to a durable log (4 threads, some appends
# conditional: unique slots and an optimistic counter) and prints every acknowledged append; it is
# SIGKILLed at a random moment (sometimes while it is still recovering), then the log is reopened
# and checked: every acknowledged append present byte for byte at its position, the log dense from
# 1, every event one that was appended, every append whole, no slot claimed twice, the counter
# exact. Then the next cycle appends to the same log.
#   scripts/log-crash.sh            20 cycles (CI)
#   scripts/log-crash.sh --full     200 cycles
#   scripts/log-crash.sh --cycles N
# Uses the dev build of examples/log_crash_child.rs (built here if needed). Prints a PASS or
# FAIL line last; exits non-zero on failure, keeping the log directory for a look.
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
cargo build --quiet --example log_crash_child
bin="${CARGO_TARGET_DIR:-target}/debug/examples/log_crash_child"
work=$(mktemp -d "${TMPDIR:-/tmp}/lanestream-log-crash.XXXXXX")
dir="$work/log" acks="$work/acks.txt"
: > "$acks"
start=$(date +%s)
for cycle in $(seq 1 "$cycles"); do
    "$bin" append "$dir" "$cycle" >> "$acks" 2> "$work/child.err" &
    pid=$!
    # 20-400 ms: early kills land in recovery, later ones mid-append.
    sleep "$(printf '0.%03d' $(( RANDOM % 380 + 20 )))"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if grep -q . "$work/child.err"; then
        echo "child of cycle $cycle wrote to stderr:"; cat "$work/child.err"
        echo "FAIL: log crash test, cycle $cycle (log kept in $work)"
        exit 1
    fi
    if ! out=$("$bin" verify "$dir" "$acks"); then
        echo "$out"
        echo "FAIL: log crash test, cycle $cycle (log kept in $work)"
        exit 1
    fi
    if [ $(( cycle % 10 )) -eq 0 ] || [ "$cycle" -eq "$cycles" ]; then
        echo "cycle $cycle: $out"
    fi
done
echo "PASS: log crash test, $cycles SIGKILL cycles in $(( $(date +%s) - start ))s: ${out#ok: }"
rm -rf "$work"
