#!/usr/bin/env bash
# The seams of the live pipeline, as an operator meets them, through the harness binary (its flags
# only, so that any build of it can be checked: PIPELINE=path/to/lanestream-pipeline). Each
# scenario is named after its rule, and each check replays every sink's whole output and compares
# it with the source tables (row_to_json of what the publication publishes), never with what the
# pipeline says it published:
#
#   p3  a backfill asked with --backfill, the pipeline SIGKILLed while the sinks hold some of it,
#       restarted without --backfill: every sink must end equal to the table (the backfill is owed
#       in each sink's state, and asked again by the library itself);
#   p2  two sinks run; the pipeline restarts with a third (a joiner): the third must end equal to
#       the tables; and a table added to the publication while the pipeline was down, with no
#       change after, must reach every sink whole;
#   p2  a table removed from the publication, changed, and added again while the pipeline runs:
#       every sink must end equal to it (the rows deleted while it was out gone);
#   p4  a publication with a column list (a PII column) and a row filter, the sinks new (so
#       backfilled): no excluded column in any output, no row outside the filter;
#   p9  --create-slot on a database with a table without a replica identity: no publication that
#       breaks the application's UPDATE; a NaN / Infinity key streams as a value of its own.
#
# Prints one line per check and `PASS: ...` or `FAIL: ...` last (the exit status matches).
#   scripts/e2e-seams.sh              (about a minute: builds the harness if PIPELINE is unset)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

pg_ensure_packages
if [[ -z ${PIPELINE:-} ]]; then
    pg_log "building the pipeline harness"
    (cd "$root" && cargo build --release --quiet -p lanestream-postgres --bin lanestream-pipeline)
    target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    PIPELINE=$target_dir/release/lanestream-pipeline
fi
pg_start
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
helper="python3 $here/e2e_postgres.py"
export PSQL=$PG_BIN/psql
fail=0
failed=()
check() { # CONDITION WHAT
    if eval "$1"; then pg_log "ok: $2"; else
        pg_log "FAILED: $2"
        fail=1
        failed+=("$2")
    fi
}
end_lsn() { pg_psql -Atc "SELECT pg_current_wal_flush_lsn()"; }
# The tables as "index<TAB>row": TABLE INDEX [COLUMNS] [WHERE ...]
dump() { pg_psql -At -F $'\t' -c "SELECT '$2', row_to_json(x) FROM (SELECT ${3:-*} FROM $1 ${4:-}) x"; }
# Every sink of DIR replayed against the dump FILE: "ok" or what differs.
equal() { # DIR SINKS DUMP
    local s out=""
    for s in ${2//,/ }; do
        out+=$($helper replay "$1/$s.ndjson" "$3" 2>&1 | grep -v "replayed output equals" || true)
    done
    [[ -z $out ]] && echo ok || echo "$out" | head -c 600
}
run() { # DIR SLOT PUBLICATION SINKS [FLAGS...]: to the end of the WAL as it is now
    local dir=$1 slot=$2 publication=$3 sinks=$4
    shift 4
    "$PIPELINE" --source "$url" --slot "$slot" --publication "$publication" --sinks "$sinks" --out "$dir" \
        --quiet --end-lsn "$(end_lsn)" "$@" >"$dir.out" 2>&1
}

# ---- p3: a backfill killed before the sinks made it durable, restarted without asking -------------
pg_psql -c "CREATE TABLE p3 (id int PRIMARY KEY, v text); CREATE TABLE p3_side (id int PRIMARY KEY);
    INSERT INTO p3 SELECT g, md5(g::text) FROM generate_series(1, 60000) g;
    CREATE PUBLICATION p3_pub FOR TABLE p3, p3_side;" >/dev/null
pg_psql -Atc "SELECT pg_create_logical_replication_slot('p3', 'pgoutput')" >/dev/null
dir=$PG_TMP/p3
mkdir -p "$dir"
# The first run: backfill asked, the slowest sink far behind; SIGKILLed a moment in.
"$PIPELINE" --source "$url" --slot p3 --publication p3_pub --out "$dir" --quiet --backfill public_p3 \
    --backfill-chunk-rows 2000 --slow-sink --slow-sink-micros 20000 >"$dir.first" 2>&1 &
pid=$!
sleep 2
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
pg_psql -c "UPDATE p3 SET v = 'changed' WHERE id % 1000 = 0; INSERT INTO p3_side VALUES (1)" >/dev/null
# Restarted as an operator would, without asking again.
run "$dir" p3 p3_pub 3 || true
dump p3 public_p3 >"$dir.tables"
dump p3_side public_p3_side >>"$dir.tables"
result=$(equal "$dir" search,cache,archive "$dir.tables")
check '[[ $result == ok ]]' "p3: a backfill killed before its sinks made it durable is asked again after a restart, and every sink ends equal to the table: $result"

# ---- p2: a third sink joins; a table joins the publication while the pipeline is down ------------
pg_psql -c "CREATE TABLE p2 (id int PRIMARY KEY, v int); CREATE TABLE p2_late (id int PRIMARY KEY, v int);
    INSERT INTO p2 SELECT g, g FROM generate_series(1, 1000) g;
    INSERT INTO p2_late SELECT g, g FROM generate_series(1, 150) g;
    CREATE PUBLICATION p2_pub FOR TABLE p2;" >/dev/null
pg_psql -Atc "SELECT pg_create_logical_replication_slot('p2', 'pgoutput')" >/dev/null
dir=$PG_TMP/p2
mkdir -p "$dir"
pg_psql -c "INSERT INTO p2 VALUES (1001, 1001)" >/dev/null
# Two sinks; their first start backfills them (or, before the rule, would not: the slot was made
# after the rows) — the third's join is what this checks.
run "$dir" p2 p2_pub 2 --backfill public_p2 || true
pg_psql -c "UPDATE p2 SET v = v + 1 WHERE id % 10 = 0; ALTER PUBLICATION p2_pub ADD TABLE p2_late;
    INSERT INTO p2 VALUES (1002, 1002)" >/dev/null
run "$dir" p2 p2_pub 3 || true
dump p2 public_p2 >"$dir.tables"
dump p2_late public_p2_late >>"$dir.tables"
result=$(equal "$dir" archive "$dir.tables")
check '[[ $result == ok ]]' "p2: a sink added to a pipeline with history gets that history: $result"
result=$(equal "$dir" search,cache "$dir.tables")
check '[[ $result == ok ]]' "p2: a table added to the publication while the pipeline was down reaches every sink whole: $result"

# ---- p2: a table leaves the publication and rejoins it while the pipeline runs ------------------
pg_psql -c "CREATE TABLE p2r (id int PRIMARY KEY, v text);
    INSERT INTO p2r SELECT g, 'old' FROM generate_series(1, 2000) g;
    CREATE PUBLICATION p2r_pub FOR TABLE p2r;" >/dev/null
pg_psql -Atc "SELECT pg_create_logical_replication_slot('p2r', 'pgoutput')" >/dev/null
dir=$PG_TMP/p2r
mkdir -p "$dir"
run "$dir" p2r p2r_pub 3 --backfill public_p2r || true
# Live: out, changed while out (none of it streamed), back in, nothing after; stopped (SIGTERM)
# once a few checks passed, then run to the end of the WAL.
"$PIPELINE" --source "$url" --slot p2r --publication p2r_pub --out "$dir" --quiet \
    --publication-check-ms 200 >"$dir.live" 2>&1 &
pid=$!
sleep 1
pg_psql -c "ALTER PUBLICATION p2r_pub DROP TABLE p2r; UPDATE p2r SET v = 'changed while out' WHERE id % 3 = 0;
    DELETE FROM p2r WHERE id % 5 = 0; INSERT INTO p2r SELECT g, 'new' FROM generate_series(2001, 2100) g" >/dev/null
sleep 1
pg_psql -c "ALTER PUBLICATION p2r_pub ADD TABLE p2r" >/dev/null
sleep 3
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
run "$dir" p2r p2r_pub 3 || true
dump p2r public_p2r >"$dir.tables"
result=$(equal "$dir" search,cache,archive "$dir.tables")
check '[[ $result == ok ]]' "p2: a table that leaves the publication and rejoins it while the pipeline runs ends equal in every sink: $result"

# ---- p4: column list and row filter ------------------------------------------------------------
pg_psql -c "CREATE TABLE p4 (id int PRIMARY KEY, name text, ssn text);
    INSERT INTO p4 SELECT g, 'n' || g, 'secret-' || g FROM generate_series(1, 3000) g;
    CREATE TABLE p4_rows (id int PRIMARY KEY, v text);
    INSERT INTO p4_rows SELECT g, 'v' || g FROM generate_series(1, 3000) g;
    CREATE PUBLICATION p4_pub FOR TABLE p4 (id, name), p4_rows WHERE (id % 2 = 0);" >/dev/null
pg_psql -Atc "SELECT pg_create_logical_replication_slot('p4', 'pgoutput')" >/dev/null
dir=$PG_TMP/p4
mkdir -p "$dir"
run "$dir" p4 p4_pub 3 --backfill public_p4,public_p4_rows || true
dump p4 public_p4 "id, name" >"$dir.tables"
dump p4_rows public_p4_rows "*" "WHERE id % 2 = 0" >>"$dir.tables"
leaked=$(cat "$dir"/*.ndjson | grep -c secret || true)
check '((leaked == 0))' "p4: a column the publication excludes never leaves the database ($leaked output lines hold it)"
result=$(equal "$dir" search,cache,archive "$dir.tables")
check '[[ $result == ok ]]' "p4: a backfill sends exactly the rows the publication's row filter admits: $result"

# ---- p9: the publication never breaks the application's writes; NaN and infinite keys ---------
pg_psql -c "CREATE DATABASE p9" >/dev/null
pg_psql -d p9 -c "CREATE TABLE keyed (id numeric PRIMARY KEY, v text); CREATE TABLE log (at timestamptz, what text);
    INSERT INTO log VALUES (now(), 'a')" >/dev/null
dir=$PG_TMP/p9
mkdir -p "$dir"
"$PIPELINE" --source "postgres://postgres@127.0.0.1:$PGPORT/p9" --slot p9 --publication p9_pub --create-slot \
    --out "$dir" --quiet --end-lsn "$(end_lsn)" >"$dir.create" 2>&1 || true
updated=ok
pg_psql -d p9 -c "UPDATE log SET what = 'b'" >/dev/null 2>"$dir.update" || updated=$(head -c 200 "$dir.update")
check '[[ $updated == ok ]]' "p9: --create-slot never creates a publication that breaks the application's UPDATE: $updated"
pg_psql -d p9 -c "DROP TABLE log" >/dev/null
pg_psql -d p9 -c "SELECT pg_drop_replication_slot('p9') FROM pg_replication_slots WHERE slot_name = 'p9';
    DROP PUBLICATION IF EXISTS p9_pub; CREATE PUBLICATION p9_pub FOR TABLE keyed" >/dev/null
pg_psql -d p9 -Atc "SELECT pg_create_logical_replication_slot('p9', 'pgoutput')" >/dev/null
rm -rf "$dir" && mkdir -p "$dir"
pg_psql -d p9 -c "INSERT INTO keyed VALUES ('NaN', 'a'), ('Infinity', 'b'), ('-Infinity', 'c'), (1, 'd');
    UPDATE keyed SET v = 'changed' WHERE id = 'NaN'" >/dev/null
"$PIPELINE" --source "postgres://postgres@127.0.0.1:$PGPORT/p9" --slot p9 --publication p9_pub --out "$dir" \
    --quiet --end-lsn "$(end_lsn)" >"$dir.out" 2>&1 || true
keys=$(python3 -c '
import json, sys
rows = {}
for l in open(sys.argv[1]):
    e = json.loads(l)
    rows[e["id"]] = e["document"]
print(" ".join(sorted(rows)), rows.get("NaN", {}).get("v"))' "$dir/search.ndjson" 2>/dev/null || echo "no output: $(tail -c 300 "$dir.out")")
check '[[ $keys == "-Infinity 1 Infinity NaN changed" ]]' "p9: NaN, Infinity and -Infinity keys stream as values of their own (ids: $keys)"

if ((fail)); then
    echo "FAIL: ${#failed[@]} seams checks failed: ${failed[*]}" | cut -c1-2000
    exit 1
fi
echo "PASS: every seams check held: each sink's whole output equals the source tables"
