#!/usr/bin/env bash
# Runs every loom model under `--cfg lanestream_loom`: the lane engine's (loom-tests/, the test
# binary `loom` of the core) and the event log's (log/loom-tests/, the test binary `loom` of
# lanestream-log).
#   scripts/loom.sh [test name filter...]
# Each model runs with its own preemption bound (2-3, written and justified next to it);
# `LOOM_MAX_PREEMPTIONS=N scripts/loom.sh` overrides every bound (e.g. to search deeper by hand).
# Builds into target/loom (the RUSTFLAGS differ from a normal build, so a separate target dir
# keeps both caches warm) with the `loom` profile (optimised, debug assertions on). On the shared
# 2-core machine a cold build takes about 5 minutes and the models about 20 seconds; a failing
# model prints loom's message (causality violation, deadlock, leak, or the model's assertion).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${RUSTFLAGS:-}" in
    *lanestream_loom*) ;;
    *) export RUSTFLAGS="${RUSTFLAGS:-} --cfg lanestream_loom" ;;
esac
# loom's own backtraces are long; keep them off unless asked for.
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"
start=$(date +%s)
for package in lanestream lanestream-log; do
    cargo test --profile loom --target-dir target/loom -p "$package" --test loom -- --nocapture --test-threads 1 "$@"
done
echo "loom: all models passed in $(( $(date +%s) - start ))s"
