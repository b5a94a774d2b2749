#!/usr/bin/env bash
# Runs one cargo-fuzz target with nightly for SECONDS, on its committed corpus.
#   scripts/fuzz.sh TARGET SECONDS [extra libFuzzer flags...]
# TARGET: lane_ops | shared_ring_ops | codec_decode (the core, lanestream: fuzz/, harnesses in
# tests/) | wal2json_lines (the wal2json reader of lanestream-postgres; its harness is
# postgres/tests/fuzz_harness/mod.rs, its target and corpus in fuzz/) | log_segment | log_ops (the
# event log, lanestream-log: its own fuzz crate log/fuzz/, harnesses in log/tests/fuzz_harness/).
# Each corpus lives beside its target, in FUZZ_CRATE/corpus.
# Needs `rustup toolchain install nightly` and `cargo install cargo-fuzz`. New inputs go to
# FUZZ_CRATE/corpus/TARGET (minimize it afterwards with `cargo +nightly fuzz cmin TARGET` there);
# crashes go to FUZZ_CRATE/artifacts/TARGET.
set -euo pipefail
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]}
case "$target" in
    log_*) cd "$(dirname "$0")/../log/fuzz" ;;
    *) cd "$(dirname "$0")/../fuzz" ;;
esac
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]}
shift 2
mkdir -p "corpus/$target"
exec cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -print_final_stats=1 "$@"
