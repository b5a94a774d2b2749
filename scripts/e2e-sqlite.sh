#!/usr/bin/env bash
# The SQL replica end to end: postgres/examples/sqlite_replica.rs keeps SQLite tables equal to
# PostgreSQL tables through an initial backfill, a live writer with DDL, and two SIGKILLs.
#
#   1. tables with a primary key (one composite) and a large TEXT column stored out of line
#      (STORAGE EXTERNAL, > 2 kB: TOASTed), REPLICA IDENTITY DEFAULT; $E2E_SQLITE_ROWS rows
#      (default 50,000) loaded;
#   2. the replica started on a new SQLite file (the pipeline backfills it), SIGKILLed
#      mid-backfill, restarted; the backfill completes;
#   3. a writer for $E2E_SQLITE_WRITER_SECS seconds (default 60): inserts, updates that leave the
#      big column unchanged (partial updates), updates that change the primary key and leave it
#      unchanged, deletes, multi-row updates, a TRUNCATE of a small table now and then, and DDL
#      between the DML (ADD COLUMN, RENAME COLUMN, DROP COLUMN); the replica SIGKILLed halfway and
#      restarted;
#   4. the writer done, the replica stopped and run once more up to the server's current LSN
#      (its end argument): it catches up and exits;
#   5. every table compared row by row, column by column (scripts/e2e_sqlite.py): rows compared,
#      missing, wrong, extra, and the transactions applied (each position once: the replica's
#      position table refuses a second).
#
# Prints `PASS: ...` or `FAIL: ...` last; the exit status matches. REPLICA=path/to/sqlite_replica
# runs a given build (else it is built here); E2E_SQLITE_LOG=FILE keeps the replica's stderr.
#
# E2E_SQLITE_OVERLAP=1 starts the writer right after the restart, while the backfill runs (by
# default it starts after it): its partial updates (the big column unchanged, so not sent) of rows the replica does not
# hold yet go out whole (the live source reads their unchanged values while their table is owed a
# backfill: LiveMetrics::partial_filled); before, the replica got them with no row to take the
# unchanged value from and stopped, loudly.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

rows=${E2E_SQLITE_ROWS:-50000}
writer_secs=${E2E_SQLITE_WRITER_SECS:-60}
pg_ensure_packages
if [[ -z ${REPLICA:-} ]]; then
    pg_log "building the sqlite_replica example"
    (cd "$root" && cargo build --release --quiet -p lanestream-postgres --example sqlite_replica)
    target_dir=$(cd "$root" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    REPLICA=$target_dir/release/examples/sqlite_replica
fi
pg_start
export PSQL=$PG_BIN/psql
url="postgres://postgres@127.0.0.1:$PGPORT/postgres"
db=$PG_TMP/replica.sqlite
replica_log=${E2E_SQLITE_LOG:-$PG_TMP/replica.log}  # the replica's stderr, every instance
helper="python3 $here/e2e_sqlite.py"
tables="public.items public.accounts public.events"
started=$(date +%s)
replica_pid=
instance=0
start_replica() { # [END-LSN]
    instance=$((instance + 1))
    "$REPLICA" "$url" sqlite_pub sqlite_slot "$db" "$@" >>"$replica_log" 2>&1 &
    replica_pid=$!
    pg_log "replica #$instance started (pid $replica_pid)"
}
kill_replica() { # SIGNAL
    kill "-$1" "$replica_pid" 2>/dev/null || true
    wait "$replica_pid" 2>/dev/null || true
    pg_log "replica #$instance stopped with SIG$1"
}
stop_all() {
    if [[ -n $replica_pid ]]; then kill -KILL "$replica_pid" 2>/dev/null || true; fi
    if [[ -n ${writer_pid:-} ]]; then kill "$writer_pid" 2>/dev/null || true; fi
    pg_cleanup
}
trap stop_all EXIT
fail() {
    pg_log "replica log tail:"
    tail -n 20 "$replica_log" >&2 || true
    echo "FAIL: $*"
    exit 1
}

# ---- 1. the tables -------------------------------------------------------------------------------
pg_log "loading $rows rows"
pg_psql -v rows="$rows" >/dev/null <<'SQL'
CREATE TABLE items (id bigint PRIMARY KEY, n integer, price numeric(12,2), score float8,
                    flag boolean, note text, big text);
ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE accounts (region text, num integer, balance numeric, big text, PRIMARY KEY (region, num));
ALTER TABLE accounts ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE events (id bigint PRIMARY KEY, kind text, at timestamptz);
INSERT INTO items SELECT g, g % 1000, round(g * 1.37, 2), g / 7.0, g % 3 = 0, 'note ' || g,
    repeat(md5(g::text), 70) FROM generate_series(1, :rows) g;
INSERT INTO accounts SELECT (ARRAY['eu', 'us', 'ap'])[1 + g % 3], g, g * 10.5, repeat(md5((g * 7)::text), 70)
    FROM generate_series(1, 2000) g;
INSERT INTO events SELECT g, 'kind ' || g, now() FROM generate_series(1, 100) g;
CREATE SEQUENCE newid START 10000000;
CREATE PUBLICATION sqlite_pub FOR TABLE items, accounts, events;
SQL
toast=$(pg_psql -Atc "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'items'")
((toast > 0)) || fail "items.big is not stored out of line"
pg_log "items: $(pg_psql -Atc "SELECT pg_size_pretty(pg_relation_size('items'))") of rows, $((toast >> 20)) MiB out of line"

# The writer (section 3), a transaction per iteration.
pg_psql >/dev/null <<'SQL'
CREATE PROCEDURE writer(secs int, rows int) LANGUAGE plpgsql AS $$
DECLARE
    stop timestamptz := clock_timestamp() + make_interval(secs => secs);
    i int := 0;
    r bigint;
    hi bigint;
    step int := 0;
    col text;      -- the column added last (renamed at the next step)
    old text;      -- the column renamed a cycle ago (dropped at the next drop step)
BEGIN
    WHILE clock_timestamp() < stop LOOP
        i := i + 1;
        hi := (SELECT last_value FROM newid);
        r := CASE WHEN random() < 0.5 THEN 1 + floor(random() * rows)
                  ELSE 10000000 + floor(random() * (hi - 9999999)) END;
        CASE i % 10
        WHEN 0, 1 THEN
            INSERT INTO items (id, n, price, score, flag, note, big)
            VALUES (nextval('newid'), i, i * 0.01, i / 3.0, i % 2 = 0, 'inserted ' || i, repeat(md5(i::text), 70));
        WHEN 2, 3, 4 THEN  -- a partial update: big unchanged (TOASTed, not sent)
            UPDATE items SET n = n + 1, note = 'updated ' || i, price = price + 0.01, flag = NOT flag WHERE id = r;
            IF col IS NOT NULL THEN
                EXECUTE format('UPDATE items SET %I = %L WHERE id = %s', col, i, r);
            END IF;
        WHEN 5 THEN        -- the key changes, big unchanged
            UPDATE items SET id = nextval('newid'), n = -n WHERE id = r;
        WHEN 6 THEN
            DELETE FROM items WHERE id = r;
        WHEN 7 THEN        -- a composite key changes, big unchanged
            UPDATE accounts SET num = num + 100000, balance = balance + 1
            WHERE (region, num) IN (SELECT region, num FROM accounts WHERE num % 50 = i % 50 LIMIT 1);
        WHEN 8 THEN        -- big itself changes; an event
            UPDATE items SET big = repeat(md5((i * 3)::text), 70), score = score * 2 WHERE id = r;
            INSERT INTO events VALUES (nextval('newid'), 'kind ' || i, now());
        ELSE               -- several partial updates in one transaction
            UPDATE accounts SET balance = balance * 1.01 WHERE num % 97 = i % 97;
        END CASE;
        IF i % 250 = 0 THEN
            TRUNCATE events;
        END IF;
        IF i % 500 = 0 THEN  -- a large transaction (2,000 partial updates): the replica takes it in parts
            UPDATE accounts SET balance = balance + 0.5;
        END IF;
        IF i % 300 = 0 THEN  -- DDL, each step followed by DML of the table (the next iterations)
            step := step + 1;
            IF step % 3 = 1 THEN
                col := 'extra_' || step;
                EXECUTE format('ALTER TABLE items ADD COLUMN %I %s', col,
                               CASE WHEN step % 2 = 0 THEN 'integer' ELSE 'text' END);
            ELSIF step % 3 = 2 THEN
                EXECUTE format('ALTER TABLE items RENAME COLUMN %I TO %I', col, col || '_renamed');
                col := col || '_renamed';
            ELSE
                IF old IS NOT NULL THEN
                    EXECUTE format('ALTER TABLE items DROP COLUMN %I', old);
                END IF;
                old := col;
                col := NULL;
            END IF;
        END IF;
        COMMIT;
        PERFORM pg_sleep(0.002);
    END LOOP;
    RAISE NOTICE 'writer: % transactions, % DDL steps', i, step;
END $$;
SQL
start_writer() {
    pg_log "writer: $writer_secs s"
    pg_psql -c "CALL writer($writer_secs, $rows)" >"$PG_TMP/writer.log" 2>&1 &
    writer_pid=$!
}

# ---- 2. the backfill, SIGKILLed once ------------------------------------------------------------
start_replica
for _ in $(seq 600); do
    held=$($helper count "$db" public_items)
    ((held >= rows / 10)) && break
    sleep 0.05
done
state=$($helper state "$db")
kill_replica KILL
kills=1
held=$($helper count "$db" public_items)
[[ $state == *'"owed"'* && $held -lt $rows ]] ||
    fail "the replica was not killed mid-backfill (held $held of $rows rows; state $state)"
pg_log "killed mid-backfill: $held of $rows rows of items held, state $state"
start_replica
# E2E_SQLITE_OVERLAP=1: the writer starts now, while the backfill runs (partial updates of rows
# the replica does not hold yet).
if [[ ${E2E_SQLITE_OVERLAP:-0} == 1 ]]; then start_writer; fi
for _ in $(seq 1200); do
    state=$($helper state "$db")
    [[ -n $state && $state != *'"owed"'* ]] && break
    kill -0 "$replica_pid" 2>/dev/null || fail "the replica stopped during the backfill"
    sleep 0.1
done
[[ $state != *'"owed"'* ]] || fail "the backfill did not complete: $state"
held=$($helper count "$db" public_items)
[[ $held == "$rows" || -n ${writer_pid:-} ]] || fail "backfill complete with $held of $rows rows of items"
pg_log "backfill complete after the restart: $held rows of items ($(($(date +%s) - started)) s)"

# ---- 3. the writer, the replica SIGKILLed halfway ------------------------------------------------
[[ -n ${writer_pid:-} ]] || start_writer
sleep $((writer_secs / 2))
kill_replica KILL
kills=2
sleep 1
start_replica
wait "$writer_pid" || { cat "$PG_TMP/writer.log" >&2; fail "the writer failed"; }
writer_pid=
pg_log "$(grep -o 'writer: .*' "$PG_TMP/writer.log")"

# ---- 4. catch up to the server's current LSN, and stop ---------------------------------------------
end=$(pg_psql -Atc "SELECT pg_current_wal_insert_lsn()")
kill_replica TERM  # runs until killed: stop it, then once more up to $end
start_replica "$end"
if ! timeout 300 tail --pid="$replica_pid" -f /dev/null; then fail "the final catch-up did not end"; fi
wait "$replica_pid" || fail "the final catch-up failed"
replica_pid=
pg_log "caught up to $end"
ddl=$(grep -c 'ALTER TABLE' "$replica_log" || true)

# ---- 5. compare ---------------------------------------------------------------------------------------
pg_log "the replica ran $ddl ALTER TABLE statements (a killed instance's uncommitted ones again); kills: $kills SIGKILL (one mid-backfill, one mid-stream)"
# shellcheck disable=SC2086
$helper compare "$db" $tables || rc=$?
[[ ${rc:-0} == 0 ]] || tail -n 5 "$replica_log" >&2
pg_log "runtime $(($(date +%s) - started)) s"
exit "${rc:-0}"
