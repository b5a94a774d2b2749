#!/usr/bin/env bash
# Captures a realistic PostgreSQL logical-decoding stream in wal2json format-version 2 into
# data/wal2json-sample.jsonl.gz at the workspace root (the default input of lanestream-postgres's
# pipeline harness, postgres/src/bin/lanestream-pipeline/, and of its reader's bundled-capture test).
#
# Installs postgresql-15 and postgresql-15-wal2json with apt-get if missing (needs root then),
# starts a throwaway cluster in a temp dir (as the postgres user when run as root), creates a
# wal2json slot, runs the workload from scripts/pg-common.sh, streams the slot with pg_recvlogical
# up to pg_current_wal_lsn() taken after the workload, checks that the end-of-workload marker
# transaction was received and that every B has its C, then writes the gzip file. The cluster and
# temp dir are removed on exit, whatever happens. Running it again overwrites the capture.
#
# Usage: scripts/capture-wal2json.sh [OUTPUT.jsonl.gz]   (PG_WORKLOAD_SCALE=N to grow the workload)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

out=${1:-$(dirname "$here")/data/wal2json-sample.jsonl.gz}

pg_ensure_packages
pg_start
pg_create_slot
pg_log "running the workload"
pg_workload
endpos=$(pg_end_lsn)
pg_log "streaming the slot up to $endpos"
raw=$PG_TMP/capture.jsonl
pg_recvlogical_stream "$endpos" "$raw"

# The capture must hold the whole workload: the marker message, then its transaction's commit.
grep -q '"content":"end-of-workload"' "$raw" || pg_die "end-of-workload marker not received"
[[ $(tail -n 1 "$raw") == '{"action":"C"'* ]] || pg_die "capture does not end with a commit"
begins=$(grep -c '^{"action":"B"' "$raw" || true)
commits=$(grep -c '^{"action":"C"' "$raw" || true)
[[ $begins -eq $commits ]] || pg_die "$begins B lines but $commits C lines"

mkdir -p "$(dirname "$out")"
gzip -9 -n <"$raw" >"$out.tmp"
mv "$out.tmp" "$out"
pg_log "wrote $out: $(wc -l <"$raw") lines, $commits transactions, $(stat -c %s "$out") bytes gzipped"
