#!/usr/bin/env bash
# Runs one cargo-fuzz target with nightly for SECONDS, on its committed corpus.
#   scripts/fuzz.sh TARGET SECONDS [extra libFuzzer flags...]
# TARGET: lane_ops | shared_ring_ops | codec_decode | log_segment | log_ops (the core, lanestream)
# | wal2json_lines (the wal2json reader of lanestream-postgres, postgres/; its harness is
# postgres/tests/fuzz_harness/mod.rs, the others' tests/). The corpora all live in fuzz/corpus.
# Needs `rustup toolchain install nightly` and `cargo install cargo-fuzz`. New inputs go to
# fuzz/corpus/TARGET (minimize it afterwards with `cargo +nightly fuzz cmin TARGET`); crashes go
# to fuzz/artifacts/TARGET.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]}
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]}
shift 2
mkdir -p "corpus/$target"
exec cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -print_final_stats=1 "$@"
