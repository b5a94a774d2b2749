#!/usr/bin/env bash
# End to end against a real PostgreSQL: a throwaway PostgreSQL 15 cluster with wal2json (the same
# helpers and workload as scripts/capture-wal2json.sh, from scripts/pg-common.sh), streamed by
# pg_recvlogical straight into the pipeline example over a pipe:
#
#   pg_recvlogical --start --endpos=<LSN after the workload> -f - \
#     | cargo run --release -p lanestream-postgres --example pipeline -- --input - --summary-json ...
#
# pg_recvlogical never exits on its own, so it is given --endpos = pg_current_wal_insert_lsn()
# taken after the workload. Then the summary is checked: result == "PASS", transactions_lost ==
# envelopes_lost == 0, final_watermark_lsn == last_commit_lsn (not null), changes_published > 0,
# and transactions_published == the number of C lines streamed.
# Installs the Debian packages if missing (root), cleans up the cluster on exit.
#
# Usage: scripts/e2e-postgres.sh [extra pipeline args, e.g. --chaos]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

pg_ensure_packages
pg_log "building the pipeline example (lanestream-postgres)"
(cd "$root" && cargo build --release --quiet -p lanestream-postgres --example pipeline)

pg_start
pg_create_slot
pg_log "running the workload"
pg_workload
endpos=$(pg_end_lsn)

summary=$PG_TMP/summary.json
stream=$PG_TMP/stream.jsonl
pg_log "streaming the slot up to $endpos through the pipeline"
pg_recvlogical_stream "$endpos" - | tee "$stream" |
    (cd "$root" && cargo run --release --quiet -p lanestream-postgres --example pipeline -- \
        --input - --out "$PG_TMP/out" --summary-json "$summary" --quiet "$@")

# Top-level fields of the pretty-printed summary (two-space indent).
field() { sed -n "s/^  \"$1\": \(.*\)$/\1/p" "$summary" | sed 's/,$//'; }
result=$(field result)
lost=$(field transactions_lost)
lost_envelopes=$(field envelopes_lost)
changes=$(field changes_published)
transactions=$(field transactions_published)
watermark=$(field final_watermark_lsn)
last=$(field last_commit_lsn)
commits=$(grep -c '^{"action":"C"' "$stream" || true)

fail=0
check() {
    if eval "$1"; then pg_log "ok: $2"; else
        pg_log "FAILED: $2"
        fail=1
    fi
}
check '[[ $result == \"PASS\" ]]' "result == PASS (got $result)"
check '[[ $lost == 0 && $lost_envelopes == 0 ]]' "transactions_lost == envelopes_lost == 0 (got $lost, $lost_envelopes)"
check '[[ $changes =~ ^[0-9]+$ && $changes -gt 0 ]]' "changes > 0 (got $changes)"
check '[[ $watermark != null && $watermark == "$last" ]]' "final_watermark_lsn == last_commit_lsn ($watermark vs $last)"
check '[[ $transactions == "$commits" ]]' "transactions == C lines streamed ($transactions vs $commits)"
[[ $fail -eq 0 ]] || exit 1
pg_log "end to end ok: $transactions transactions, $changes changes, watermark $watermark"
