#!/usr/bin/env bash
# Runs the unit tests and the doctests under Miri, when nightly with Miri is installed
# (`rustup component add --toolchain nightly miri rust-src`); otherwise says so and succeeds.
#   scripts/miri.sh
# Two runs of the core (lanestream), because of one dependency:
# - `--lib` under Tree Borrows: the codec's tests validate rkyv archives, and rkyv's relative
#   pointers are sound under Tree Borrows but not under Stacked Borrows (rkyv's maintainers
#   recommend `-Zmiri-tree-borrows`, rkyv/rkyv#436; the default model reports a retag error
#   inside `rkyv::string::repr`).
# - `--doc` under the default Stacked Borrows: the engine's doc examples (publish, recv, ack,
#   nack, redelivery, watermark, the threaded pipeline in the crate docs) run the ring's unsafe
#   code (slot cells, `ptr::read` on reclaim, teardown) with the stricter aliasing model; the
#   codec's doc examples run under Tree Borrows, for the reason above.
# Then the unit tests and doctests of lanestream-postgres (postgres/: the wal2json reader) under
# Stacked Borrows.
# Skipped under Miri, each far too slow interpreted and covered natively (proptest, fuzzing):
# the event log's unit tests (src/log/tests.rs: real directories, which Miri's isolation refuses,
# and the writer thread; the log has no unsafe code), the codec's bit-flip test (thousands of decodes; stopped after 6 minutes), and in
# lanestream-postgres the wal2json proptests (they also need the file system), the
# bundled-capture tests (6018 transactions from a gzip file, and the scanner checked against
# serde_json on every line of it and of the fuzz corpus) and the deep-nesting test (lines nested
# 100,000 deep: it ran past 5 minutes interpreted), and the tests and doc examples that need the
# file system, which Miri's isolation refuses (the durable NDJSON sink's tests and its and the
# pipeline's doc examples write directories; the pgoutput capture tests read the bundled capture;
# the pgoutput proptests persist failures under the working directory). The crate forbids
# `unsafe` code: under Miri its tests check the dependencies' unsafe code it drives.
# Miri also checks data races and leaks. It builds into target/miri.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri: skipped (nightly miri not installed)"
    exit 0
fi
start=$(date +%s)
echo "miri: lanestream unit tests (Tree Borrows)"
MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-tree-borrows" cargo +nightly miri test -p lanestream --lib -- \
    --skip bit_flipped_buffers_decode_to_valid_values_or_errors
echo "miri: lanestream doctests (Stacked Borrows; the codec's under Tree Borrows, as above)"
cargo +nightly miri test -p lanestream --doc -- --skip src/codec/
MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-tree-borrows" cargo +nightly miri test -p lanestream --doc -- src/codec/
echo "miri: lanestream-postgres unit tests and doctests (Stacked Borrows)"
cargo +nightly miri test -p lanestream-postgres --lib -- \
    --skip arbitrary_lines_never_panic \
    --skip bundled_capture_parses_completely \
    --skip deep_nesting_takes_the_slow_path_and_is_refused_without_overflowing \
    --skip fast_path_reads_every_line_as_serde_json_does \
    --skip parsers_agree_on_damaged_lines \
    --skip ndjson::tests:: \
    --skip the_captured_pgoutput_gives_ \
    --skip any_string_is_written_as_the_json_string_of_itself \
    --skip no_bytes_make_the_decoder_panic
cargo +nightly miri test -p lanestream-postgres --doc -- --skip src/ndjson.rs --skip src/pipeline/mod.rs
echo "miri: passed in $(( $(date +%s) - start ))s"
