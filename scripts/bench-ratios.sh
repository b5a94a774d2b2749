#!/usr/bin/env bash
# Runs the core's peer benchmarks (benches/peers.rs, package lanestream) and prints one table of
# ratios from that run: workload, contender, median time per iteration, and the ratio to
# lanestream in the same group (contender time / lanestream time: above 1 means lanestream is
# faster), then the W0 calibration spread (start vs end of the run), the performance targets met
# or missed, and the alternating harness (benches/alternate.rs).
#
# Absolute times on a shared machine drift between minutes; only the ratios from one run mean
# anything, and the W0 spread says how much the machine drifted while the run lasted.
#
# usage: scripts/bench-ratios.sh [--log] [--full] [--no-alternate] [--table-only]
#   --log           the event log's benches instead (log/benches/log-peers/benches/log.rs: lanestream-log against
#                   tephra, umadb-core and a Mutex<Vec>), ratios against lanestream in the same
#                   mode ([durable] or [memory]) and the target "ahead of both embedded peers",
#                   then the same contenders in interleaved rounds (log/benches/log-peers/benches/alternate.rs),
#                   with the cold row (a log 4x its cache on the real disk, page cache dropped: root;
#                   400k events in quick mode, 8M with --full, LOGBENCH_COLD_EVENTS to set; the logs
#                   stay in <target dir>/tmp/logbench-cold for the next run: delete them after)
#   (default)       quick mode: 0.5 s warm-up, 1 s measurement, 20 samples (whole run < 6 min
#                   once built)
#   --full          3 s warm-up, 5 s measurement, 100 samples (about 10 minutes)
#   --no-alternate  skip the alternating harness
#   --table-only    do not run anything; print the table from the last run's results
# Needs: cargo, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=quick
alternate=1
run=1
suite=peers
for a in "$@"; do
    case "$a" in
        --log) suite=log ;;
        --full) mode=full ;;
        --no-alternate) alternate=0 ;;
        --table-only) run=0 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a" >&2; exit 2 ;;
    esac
done

if [ "$mode" = quick ]; then
    crit=(--warm-up-time 0.5 --measurement-time 1 --sample-size 20 --nresamples 10000)
    # Rounds long enough that waking the partner (a fixed cost per round) does not flatten
    # the ratios (README, Performance).
    alt=(--rounds 9 --messages 200000)
    log_rounds=7
    # The log's cold row (alternate.rs): a small log in quick mode; --full runs the issue's
    # 8M events. LOGBENCH_COLD_EVENTS sets it in either mode.
    log_cold=(--cold-events "${LOGBENCH_COLD_EVENTS:-400000}")
else
    crit=(--warm-up-time 3 --measurement-time 5 --sample-size 100)
    alt=(--rounds 21 --messages 400000)
    log_rounds=21
    log_cold=()
fi

target_dir=$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
results="$target_dir/criterion"

if [ "$run" = 1 ] && [ "$suite" = log ]; then
    echo "== building log/benches/log-peers/benches/log.rs (bench profile: fat LTO, one codegen unit)" >&2
    # A crate of its own (log/benches/log-peers), built into this workspace's target directory;
    # criterion writes its results under CARGO_TARGET_DIR (else under the bench crate's folder).
    export CARGO_TARGET_DIR="$target_dir"
    log_bench=(--manifest-path log/benches/log-peers/Cargo.toml)
    cargo bench "${log_bench[@]}" --bench log --bench alternate --no-run >&2
    rm -rf "$results"/log_*
    start=$(date +%s)
    echo "== cargo bench ${log_bench[*]} --bench log -- ${crit[*]}" >&2
    cargo bench "${log_bench[@]}" --bench log -- "${crit[@]}" >&2
    echo "== criterion run took $(( $(date +%s) - start )) s" >&2
elif [ "$run" = 1 ]; then
    echo "== building benches (bench profile: fat LTO, one codegen unit)" >&2
    cargo bench -p lanestream --bench peers --bench alternate --no-run >&2
    # Only this run's results go into the table.
    rm -rf "$results"/w[0-9]_*
    start=$(date +%s)
    echo "== cargo bench -p lanestream --bench peers -- ${crit[*]}" >&2
    cargo bench -p lanestream --bench peers -- "${crit[@]}" >&2
    echo "== criterion run took $(( $(date +%s) - start )) s" >&2
fi

python3 - "$results" "$suite" <<'EOF'
import json, os, re, sys

root = sys.argv[1]
suite = sys.argv[2]
prefix = r"log_" if suite == "log" else r"w\d_"
rows = []  # (group, function, median_ns, lo_ns, hi_ns)
for dirpath, _, files in os.walk(root):
    if os.path.basename(dirpath) != "new" or "benchmark.json" not in files:
        continue
    with open(os.path.join(dirpath, "benchmark.json")) as f:
        bench = json.load(f)
    group = bench["group_id"]
    if not re.match(prefix, group):
        continue
    with open(os.path.join(dirpath, "estimates.json")) as f:
        est = json.load(f)["median"]
    ci = est["confidence_interval"]
    rows.append((group, bench["function_id"], est["point_estimate"], ci["lower_bound"], ci["upper_bound"]))

if not rows:
    sys.exit(f"no results under {root}: run without --table-only first")

def order(group):
    # w0_start first, w0_end last, the rest by name (w1..w6, sizes numerically).
    key = [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", group)]
    return (0 if group == "w0_start" else 2 if group == "w0_end" else 1, key)

def fmt(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.2f} {unit}"
    return f"{ns:.1f} ns"

def cls(function):
    m = re.search(r"\[(.*)\]$", function)
    return m.group(1) if m else ""

groups = {}
for r in rows:
    groups.setdefault(r[0], []).append(r)

def baseline(members, function):
    ours = [m for m in members if m[1].startswith("lanestream")]
    if not ours:
        return None
    same = [m for m in ours if cls(m[1]) == cls(function)]
    return (same or ours)[0]

med = {(r[0], r[1]): r[2] for r in rows}
w = max(len(r[1]) for r in rows) + 2
gw = max(len(g) for g in groups) + 2
print(f"{'workload':<{gw}}{'contender':<{w}}{'median':>12}  {'95% CI of median':>22}  {'ratio':>7}  vs")
for g in sorted(groups, key=order):
    for r in sorted(groups[g], key=lambda r: (not r[1].startswith("lanestream"), r[1])):
        b = baseline(groups[g], r[1])
        ratio = f"{r[2] / b[2]:.2f}x" if b else "-"
        vs = b[1] if b and b[1] != r[1] else ""
        ci = f"{fmt(r[3])} .. {fmt(r[4])}"
        print(f"{g:<{gw}}{r[1]:<{w}}{fmt(r[2]):>12}  {ci:>22}  {ratio:>7}  {vs}")

if suite == "log":
    # The issue's goal: ahead of both embedded peers on every append and read row (ours durable
    # against theirs, all on tmpfs; a ratio above 1 means lanestream is faster).
    print()
    print("targets (peer time / lanestream[durable] time >= 1):")
    for g in sorted(groups, key=order):
        ours = med.get((g, "lanestream[durable]"))
        for peer in ("tephra[durable]", "umadb-core[durable]"):
            theirs = med.get((g, peer))
            if ours and theirs:
                r = theirs / ours
                print(f"  {'MET' if r >= 1 else 'MISSED':<7} {g} vs {peer}: {r:.2f}x")
    sys.exit(0)

w0s = med.get(("w0_start", "atomic_pingpong[spin]"))
w0e = med.get(("w0_end", "atomic_pingpong[spin]"))
print()
if w0s and w0e:
    print(f"W0 spread: start {fmt(w0s)}, end {fmt(w0e)}, end/start {w0e / w0s:.2f}x "
          f"({(w0e - w0s) / w0s * 100:+.0f}%)")
    # The lower of the two: a calibration point taken while the machine was busy would make
    # the W3 target look easier than it is.
    w0 = min(w0s, w0e)
else:
    w0 = w0s or w0e
    print("W0 spread: only one calibration point")

print()
print("targets:")
def target(label, value, ok_if, limit, how):
    if value is None:
        print(f"  {'n/a':<7} {label}")
        return
    ok = value <= limit if ok_if == "<=" else value >= limit
    print(f"  {'MET' if ok else 'MISSED':<7} {label}: {value:.2f}x ({how} {ok_if} {limit}x)")

def ratio(g, a, b):
    x, y = med.get((g, a)), med.get((g, b))
    return x / y if x and y else None

g = "w1_one_lane/batch_1"
target("W1 batch 1 lanestream[spin] vs rtrb[spin]", ratio(g, "lanestream[spin]", "rtrb[spin]"),
       "<=", 1.5, "ours/rtrb")
target("W1 batch 1 shared ring + runs [spin] vs rtrb[spin]", ratio(g, "lanestream-shared-runs[spin]", "rtrb[spin]"),
       "<=", 1.1, "ours/rtrb")
target("W1 batch 1 lanestream[spin-then-park] vs crossbeam-channel",
       ratio(g, "crossbeam-channel[spin-then-park]", "lanestream[spin-then-park]"), ">=", 3.0, "crossbeam/ours")
target("W1 batch 1 lanestream[spin] vs crossbeam-channel",
       ratio(g, "crossbeam-channel[spin-then-park]", "lanestream[spin]"), ">=", 3.0, "crossbeam/ours")
for lanes in (4, 8):
    g = f"w2_fan_out/lanes_{lanes}"
    target(f"W2 {lanes} lanes vs disruptor", ratio(g, "lanestream[spin]", "disruptor[spin]"), "<=", 1.0, "ours/disruptor")
    target(f"W2 {lanes} lanes vs tokio broadcast", ratio(g, "tokio-broadcast[spin]", "lanestream[spin]"),
           ">=", 2.0, "broadcast/ours")
    for suffix in ("", "_batch_1"):
        g = f"w2_fan_out{suffix}/lanes_{lanes}"
        target(f"W2{suffix} {lanes} lanes, runs, vs disruptor", ratio(g, "disruptor[spin]", "lanestream-runs[spin]"),
               ">=", 1.0, "disruptor/ours")
        target(f"W2{suffix} {lanes} lanes, per-item API, vs disruptor", ratio(g, "disruptor[spin]", "lanestream[spin]"),
               ">=", 0.5, "disruptor/ours")
        for mode in ("spin", "spin-then-park"):
            target(f"W2{suffix} {lanes} lanes, shared ring + runs [{mode}], vs disruptor",
                   ratio(g, "disruptor[spin]", f"lanestream-shared-runs[{mode}]"), ">=", 1.0, "disruptor/ours")
            target(f"W2{suffix} {lanes} lanes, shared ring, per-item API [{mode}], vs disruptor",
                   ratio(g, "disruptor[spin]", f"lanestream-shared-items[{mode}]"), ">=", 0.5, "disruptor/ours")
for size in (1, 64):
    x = med.get((f"w3_round_trip/batch_{size}", "lanestream[spin]"))
    target(f"W3 batch {size} round trip vs W0 (lower of start/end)", x / w0 if x and w0 else None, "<=", 2.0, "ours/W0")
for state in ("idle", "racing"):
    g = f"w4_watermark/{state}/lanes_64"
    target(f"W4 64 lanes {state} vs relaxed min", ratio(g, "lanestream[none]", "relaxed-min[none]"),
           "<=", 1.2, "ours/bare")
target("W5 async wake vs tokio mpsc", ratio("w5_async_wake", "lanestream[park]", "tokio-mpsc[park]"),
       "<=", 1.0, "ours/tokio")
target("W6 blocking wake vs crossbeam-channel",
       ratio("w6_blocking_wake", "lanestream[spin-then-park]", "crossbeam-channel[spin-then-park]"),
       "<=", 1.0, "ours/crossbeam")
EOF

if [ "$run" = 1 ] && [ "$alternate" = 1 ] && [ "$suite" = log ]; then
    # The log's interleaved rounds (log/benches/log-peers/benches/alternate.rs): every contender once
    # per round, so load changes on a shared machine hit them alike. Read these ratios first.
    echo
    echo "== interleaved rounds (peer time / lanestream[durable] time per round, median and range)"
    cargo bench "${log_bench[@]}" --bench alternate -- --rounds "${log_rounds}" "${log_cold[@]}" 2>/dev/null \
        | grep -v '^UmaDB'
elif [ "$run" = 1 ] && [ "$alternate" = 1 ]; then
    echo
    cargo bench -p lanestream --bench alternate -- "${alt[@]}" 2>/dev/null
fi
