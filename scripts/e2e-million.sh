#!/usr/bin/env bash
# One transaction of 1,000,000 changes (ROWS) through the live source, on a throwaway PostgreSQL
# 15 (scripts/pg-common.sh), streamed from a pgoutput slot: `INSERT ... SELECT generate_series(1, ROWS)` in one
# transaction, then the pipeline in live mode (durable NDJSON sinks, the default
# --max-batch-changes 10000 and --capacity 1024, or CAPACITY) to the end of the WAL under
# /usr/bin/time -v. Checks: the run PASSes; it published ROWS changes in ROWS/10000 batches (only
# the last positioned); every sink's output holds every row exactly once with its exact document,
# at the commit LSN; the slot is confirmed at the final watermark (or past it, where nothing of ours
# was committed: the idle advance). Reports the pipeline's peak RSS (the summary's, read when its
# run ended) and the process's (with the harness's check against the table after it).
#
# Usage: scripts/e2e-million.sh   (or scripts/e2e-postgres.sh --million). Not run by CI: about
# a minute and 300 MB of sink output. Env: ROWS (1000000), CAPACITY (lane capacity, 1024),
# PIPELINE (a harness binary to run instead of building this checkout's).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"
rows=${ROWS:-1000000}
capacity=${CAPACITY:-1024}

pg_ensure_packages
command -v /usr/bin/time >/dev/null || {
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null
}
if [[ -n ${PIPELINE:-} ]]; then
    pipeline=$PIPELINE
else
    pg_log "building the pipeline harness, the lanestream-pipeline binary (lanestream-postgres)"
    (cd "$root" && cargo build --release --quiet -p lanestream-postgres --bin lanestream-pipeline)
    target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    pipeline=$target_dir/release/lanestream-pipeline
fi

pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
out=$PG_TMP/out
mkdir -p "$out"
pg_psql >/dev/null <<'SQL'
CREATE TABLE million (id int PRIMARY KEY, v text);
CREATE PUBLICATION lanestream FOR ALL TABLES;
SELECT 1 FROM pg_create_logical_replication_slot('lanestream', 'pgoutput');
SQL
SECONDS=0
pg_psql -c "INSERT INTO million SELECT g, 'v' || g FROM generate_series(1, $rows) g"
end=$(pg_psql -Atc "SELECT pg_current_wal_flush_lsn()")
pg_log "[${SECONDS}s] $rows rows inserted in one transaction; the live pipeline, to $end"
SECONDS=0
/usr/bin/time -v "$pipeline" --source "$url" --slot lanestream --joiners live-only --out "$out" --quiet --capacity "$capacity" \
    --end-lsn "$end" --summary-json "$PG_TMP/million.json" >"$PG_TMP/million.out" 2>"$PG_TMP/time.txt" || {
    cat "$PG_TMP/million.out" "$PG_TMP/time.txt" >&2
    pg_die "the pipeline failed"
}
took=$SECONDS
rss_kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$PG_TMP/time.txt")
confirmed=$(pg_psql -Atc "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lanestream'")
python3 - "$PG_TMP/million.json" "$out" "$rows" "$confirmed" <<'PY'
import json, sys
summary, out, rows, confirmed = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), sys.argv[4]
fail = []
def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what, file=sys.stderr)
    if not ok:
        fail.append(what)
chunks = rows // 10000  # a chunk at every 10000th change; the C then brings the rest (maybe none)
check(summary["result"] == "PASS", f"the run PASSes: {summary['reason']}")
check(summary["changes_published"] == rows, f"{summary['changes_published']} changes published (wanted {rows})")
check(summary["chunks_published"] == chunks, f"{summary['chunks_published']} unpositioned chunks before the positioned batch (wanted {chunks})")
# The insert's transaction, and maybe an empty one after it (the server's own).
check(1 <= summary["transactions_published"] <= 3, f"{summary['transactions_published']} transaction(s)")
lsn = lambda t: int(t.split("/")[0], 16) << 32 | int(t.split("/")[1], 16)
check(lsn(confirmed) >= lsn(summary["final_watermark_lsn"]), f"slot confirmed at {confirmed} >= the final watermark {summary['final_watermark_lsn']} (the pipeline's own summary checks it is past it only when idle)")
for sink in summary["per_sink"]:
    seen = bytearray(rows + 1)
    lines, position = 0, None
    with open(f"{out}/{sink['name']}.ndjson") as f:
        for line in f:
            lines += 1
            e = json.loads(line)
            i = int(e["id"])
            position = position or e["position"]  # every chunk's envelopes carry the commit LSN
            ok = (e["op"] == "upsert" and e["index"] == "public_million" and e["document"] == {"id": i, "v": f"v{i}"}
                  and e["position"] == position and 1 <= i <= rows and not seen[i])
            if not ok:
                check(False, f"sink {sink['name']}: bad or repeated line {line[:200]!r}")
                break
            seen[i] = 1
    check(lines == rows and sum(seen) == rows, f"sink {sink['name']}: {lines} lines, every row once, exact documents, all at the commit LSN {position}")
sys.exit(1 if fail else 0)
PY
pipeline_rss=$(python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))["peak_rss_bytes"]; print("%.1f MiB" % (b / 1048576) if b else "-")' "$PG_TMP/million.json")
pg_log "ok: $rows changes in one transaction through the live source in ${took} s; peak RSS of the pipeline $pipeline_rss (of the process, with its check of every sink's output against the table after the run, $((rss_kb / 1024)) MiB; lane capacity $capacity, chunks of 10000 changes)"
