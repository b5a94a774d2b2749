# shellcheck shell=bash
# Shared helpers for scripts/capture-wal2json.sh and scripts/e2e-postgres.sh: a throwaway
# PostgreSQL 15 cluster with the wal2json output plugin, a logical slot, and a realistic workload.
# What reads the stream is the workspace's postgres/ crate (lanestream-postgres): its wal2json
# reader (postgres/src/wal2json.rs) and pipeline harness (postgres/src/bin/lanestream-pipeline/).
#
# Source this file, then call:
#   pg_ensure_packages      install postgresql-15 and postgresql-15-wal2json (apt-get) if missing
#   pg_start                initdb + start a cluster in a fresh temp dir (under PG_TMPDIR, default
#                           /tmp: PG_TMPDIR=/dev/shm puts the cluster and the sinks' output on
#                           tmpfs, out of the disk's way); sets PG* variables and installs an
#                           EXIT/INT/TERM trap that stops it and removes the temp dir
#   pg_create_slot          create the logical slot "$PG_SLOT" with the wal2json plugin
#   pg_workload             run the workload (see the SQL below for what it covers)
#   pg_end_lsn              print pg_current_wal_insert_lsn(), the --endpos to stream up to
#   pg_recvlogical_stream ENDPOS OUT
#                           stream the slot in wal2json format-version 2 to OUT ("-" = stdout)
#                           and stop at ENDPOS
#   pg_build_harness ROOT   build the lanestream-pipeline harness (release), print its path (or
#                           PIPELINE's, when set: a harness built elsewhere)
#   pg_load, pg_summary_field FILE EXPR
#                           the load average; a field of a harness summary JSON
#
# Everything runs on a unix socket inside the temp dir plus 127.0.0.1 on a free port, so a system
# cluster (Debian's "15 main" on 5432) is never touched.

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_LIB=${PG_LIB:-/usr/lib/postgresql/15/lib}
PG_SLOT=${PG_SLOT:-lanestream}
PG_TMP=

pg_log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
pg_die() {
    pg_log "error: $*"
    exit 1
}

# Server-side commands must not run as root: run them as the postgres user when we are root.
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

pg_ensure_packages() {
    if [[ -x $PG_BIN/postgres && -x $PG_BIN/pg_recvlogical && -f $PG_LIB/wal2json.so ]]; then
        return
    fi
    [[ $EUID -eq 0 ]] || pg_die "postgresql-15 / postgresql-15-wal2json missing and not root"
    pg_log "installing postgresql-15 and postgresql-15-wal2json"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql-15 postgresql-15-wal2json >/dev/null
    [[ -f $PG_LIB/wal2json.so ]] || pg_die "wal2json.so not found after install"
}

pg_free_port() {
    local p
    for p in $(seq 54320 54999); do
        # A refused connection means nobody listens there.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

pg_cleanup() {
    local rc=$?
    if [[ -n $PG_TMP && -d $PG_TMP ]]; then
        if [[ -f $PG_TMP/data/postmaster.pid ]]; then
            as_pg "$PG_BIN/pg_ctl" -D "$PG_TMP/data" -m immediate -w stop >/dev/null 2>&1 || true
        fi
        if [[ $rc -ne 0 && -f $PG_TMP/server.log ]]; then
            pg_log "server log tail:"
            tail -n 20 "$PG_TMP/server.log" >&2 || true
        fi
        rm -rf "$PG_TMP"
    fi
    PG_TMP=
    return "$rc"
}

pg_start() {
    PG_TMP=$(mktemp -d "${PG_TMPDIR:-/tmp}/lanestream-pg.XXXXXX")
    trap pg_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    chmod 0755 "$PG_TMP"
    if [[ $EUID -eq 0 ]]; then chown postgres: "$PG_TMP"; fi
    local data=$PG_TMP/data conf=$PG_TMP/data/postgresql.conf
    as_pg "$PG_BIN/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
        --no-sync >"$PG_TMP/initdb.log" 2>&1 || {
        cat "$PG_TMP/initdb.log" >&2
        pg_die "initdb failed"
    }
    PGPORT=$(pg_free_port) || pg_die "no free port in 54320-54999"
    cat >>"$conf" <<EOF
# --- lanestream throwaway cluster ---
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$PG_TMP'
wal_level = logical
max_replication_slots = 16
max_wal_senders = 4
# A throwaway cluster: durability off, speed on (synchronous_commit stays on so the WAL holds
# every commit when the workload returns).
fsync = off
full_page_writes = off
EOF
    # `output_plugin_libraries`: PostgreSQL 15.20 (Debian 15.20-0+deb12u1) knows it and refuses
    # every output plugin it does not list ("library \"pgoutput\" may not be used as an output
    # plugin"); older 15.x builds refuse the parameter itself ("unrecognized configuration
    # parameter" is FATAL at startup). Probe: set it where the server knows it. wal2json is what
    # the pipeline reads; pgoutput is the "slot of another plugin" of postgres/tests/live.rs.
    printf "output_plugin_libraries = 'wal2json, pgoutput'\n" >>"$conf"
    if as_pg "$PG_BIN/postgres" -D "$data" -C wal_level >/dev/null 2>&1; then
        pg_log "server knows output_plugin_libraries; set to 'wal2json, pgoutput'"
    else
        sed -i '$d' "$conf"
        pg_log "server refuses output_plugin_libraries (a 15.x before the parameter); not set"
    fi
    as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$PG_TMP/server.log" -w -t 60 start >/dev/null ||
        pg_die "pg_ctl start failed: $(tail -n 5 "$PG_TMP/server.log")"
    export PGHOST=$PG_TMP PGPORT PGUSER=postgres PGDATABASE=postgres
    pg_log "cluster up: socket dir $PG_TMP, port $PGPORT"
}

pg_psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

pg_create_slot() {
    "$PG_BIN/pg_recvlogical" --create-slot --dbname="$PGDATABASE" --slot="$PG_SLOT" --plugin=wal2json ||
        pg_die "cannot create the wal2json slot"
}

pg_end_lsn() { pg_psql -Atc "SELECT pg_current_wal_insert_lsn()"; }

# wal2json format-version 2 options (checked against wal2json 2.5's option list): include-lsn
# (lsn/nextlsn on B and C, lsn on changes), include-xids, include-timestamp, include-pk (the
# primary-key columns of each change), include-types (default on). Also available but unused:
# include-type-oids, include-typmod, include-not-null, include-default, include-origin,
# include-schemas, include-transaction, include-column-positions, filter-tables, add-tables,
# filter-msg-prefixes, add-msg-prefixes, actions, write-in-chunks (v1 only), pretty-print (v1).
pg_recvlogical_stream() {
    local endpos=$1 out=$2
    "$PG_BIN/pg_recvlogical" --start --dbname="$PGDATABASE" --slot="$PG_SLOT" --no-loop --endpos="$endpos" \
        --status-interval=1 -f "$out" \
        -o format-version=2 -o include-lsn=true -o include-xids=true \
        -o include-timestamp=true -o include-pk=true
}

# The workload. Scale with PG_WORKLOAD_SCALE (default 2: ~58k changes in ~12k transactions). Covers: an empty (DDL-only)
# transaction, one large transaction, thousands of small ones, multi-row updates, primary-key
# changes (single and composite keys), deletes (default and FULL replica identity), a two-table
# truncate, unicode and JSON-hostile text, NULLs, a TOASTed value stored externally (and an update
# that leaves it unchanged), a table without a primary key (REPLICA IDENTITY FULL), quoted
# mixed-case schema/table/column names, arrays, jsonb, bytea, uuid, a savepoint rollback, a
# rolled-back transaction, transactional and non-transactional logical messages, and a final
# marker transaction.
pg_workload() {
    local scale=${PG_WORKLOAD_SCALE:-2}
    pg_psql -v scale="$scale" <<'SQL'
-- 1. DDL only: decodes as an empty transaction (B then C, no changes).
BEGIN;
CREATE SCHEMA "Inventory";
CREATE TABLE public.customers (
    id integer PRIMARY KEY, name text NOT NULL, email text, country char(2),
    vip boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE public.orders (
    id bigint PRIMARY KEY, customer_id integer NOT NULL, amount numeric(12,2), status text,
    tags text[], meta jsonb, placed_at timestamptz);
CREATE TABLE public.order_lines (
    order_id bigint, line_no smallint, sku text, qty integer, price double precision,
    PRIMARY KEY (order_id, line_no));
CREATE TABLE public.documents (id integer PRIMARY KEY, title text, body text, digest bytea);
ALTER TABLE public.documents ALTER COLUMN body SET STORAGE EXTERNAL; -- out of line, uncompressed
CREATE TABLE public.audit_log (at timestamptz, actor text, event text, detail jsonb); -- no PK
ALTER TABLE public.audit_log REPLICA IDENTITY FULL;
CREATE TABLE "Inventory"."Stock Items" ("SKU" text PRIMARY KEY, "Qty On Hand" integer, "Warehouse" text);
CREATE TABLE public.sessions (token uuid PRIMARY KEY, customer_id integer, expires_at timestamptz);
CREATE TABLE public.cart_items (customer_id integer, sku text, qty integer, PRIMARY KEY (customer_id, sku));
COMMIT;

-- 2. One large transaction: customers, orders, stock.
BEGIN;
INSERT INTO customers (id, name, email, country, vip)
SELECT i, 'customer ' || i,
       CASE WHEN i % 10 = 0 THEN NULL ELSE 'c' || i || '@example.com' END,
       CASE WHEN i % 13 = 0 THEN NULL ELSE (ARRAY['DE','FR','JP','BR','US','IN'])[1 + i % 6] END,
       i % 17 = 0
FROM generate_series(1, 3000 * :scale) i;
INSERT INTO orders (id, customer_id, amount, status, tags, meta, placed_at)
SELECT i, 1 + i % (3000 * :scale), round((i * 7.31) % 1000, 2), 'new',
       CASE WHEN i % 4 = 0 THEN ARRAY['gift', 'express'] ELSE NULL END,
       CASE WHEN i % 3 = 0 THEN jsonb_build_object('channel', 'web', 'ab', i % 2 = 0) ELSE NULL END,
       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 minute'
FROM generate_series(1, 12000 * :scale) i;
INSERT INTO "Inventory"."Stock Items"
SELECT 'SKU-' || lpad(i::text, 5, '0'), i % 500, (ARRAY['north','south'])[1 + i % 2]
FROM generate_series(1, 500) i;
COMMIT;

-- 3. Thousands of small transactions (a DO block may COMMIT between iterations).
SET lanestream.scale = :scale;
DO $$
DECLARE n int := 3000 * current_setting('lanestream.scale')::int;
BEGIN
  FOR i IN 1..n LOOP
    INSERT INTO order_lines VALUES (i, 1, 'SKU-' || lpad((1 + i % 500)::text, 5, '0'), 1 + i % 3, 9.99 + i % 7);
    IF i % 2 = 0 THEN
      INSERT INTO order_lines VALUES (i, 2, 'SKU-00001', 2, 0.5);
    END IF;
    UPDATE orders SET status = 'paid' WHERE id = i;
    IF i % 5 = 0 THEN
      INSERT INTO audit_log VALUES (now(), 'system', 'order_paid', jsonb_build_object('order', i));
    END IF;
    COMMIT;
  END LOOP;
END $$;

-- 4. Unicode, JSON-hostile text and NULLs.
BEGIN;
INSERT INTO customers (id, name, email, country) VALUES
  (900001, 'Zoë Ångström', 'zoe@example.com', 'SE'),
  (900002, '李小龍', NULL, NULL),
  (900003, '🚀 rocket 👩‍🚀', 'rocket@example.com', 'US'),
  (900004, E'O''Brien "quoted" \\ back\\slash\ttab\nnewline', NULL, 'IE'),
  (900005, 'مرحبا بالعالم', 'rtl@example.com', 'EG'),
  (900006, E'e\u0301 combining, nbsp\u00a0here, zero\u200bwidth', NULL, 'FR');
INSERT INTO audit_log VALUES (now(), NULL, 'unicode', '{"emoji": "😀", "nested": {"a": [1, null, "x"]}}');
COMMIT;

-- 5. TOAST: a > 2 kB value stored externally; then an update that does not touch it.
BEGIN;
INSERT INTO documents
SELECT i, 'doc ' || i, string_agg(md5((i * 1000 + j)::text), ' '), decode(md5(i::text), 'hex')
FROM generate_series(1, 5) i, generate_series(1, 300) j GROUP BY i;
COMMIT;
UPDATE documents SET title = 'doc 1 (renamed)' WHERE id = 1;

-- 6. Updates: multi-row, primary-key changes (single and composite keys), a no-PK table.
UPDATE customers SET vip = true, email = upper(email) WHERE id % 7 = 0 AND id <= 3000 * :scale;
UPDATE customers SET id = 800042 WHERE id = 42;
UPDATE order_lines SET line_no = line_no + 100 WHERE order_id BETWEEN 1 AND 10;
UPDATE "Inventory"."Stock Items" SET "Qty On Hand" = "Qty On Hand" - 1, "SKU" = "SKU" || '-B'
WHERE "SKU" = 'SKU-00007';
UPDATE audit_log SET actor = 'auditor' WHERE event = 'unicode';

-- 7. Deletes (default identity: PK only; FULL identity: whole old row).
DELETE FROM orders WHERE id % 50 = 0;
DELETE FROM audit_log WHERE detail ->> 'order' = '10';

-- 8. Sessions and carts, then one truncate of both tables.
INSERT INTO sessions SELECT md5(i::text)::uuid, i, now() + interval '1 hour' FROM generate_series(1, 200) i;
INSERT INTO cart_items SELECT i, 'SKU-00002', 1 FROM generate_series(1, 100) i;
TRUNCATE sessions, cart_items;

-- 9. Savepoint rollback, a rolled-back transaction, and logical messages.
BEGIN;
INSERT INTO audit_log VALUES (now(), 'savepoint', 'kept', NULL);
SAVEPOINT s1;
INSERT INTO audit_log VALUES (now(), 'savepoint', 'rolled back', NULL);
ROLLBACK TO SAVEPOINT s1;
SELECT pg_logical_emit_message(true, 'lanestream', 'transactional message') \g /dev/null
COMMIT;
BEGIN;
INSERT INTO audit_log VALUES (now(), 'nobody', 'never committed', NULL);
ROLLBACK;
SELECT pg_logical_emit_message(false, 'lanestream', 'non-transactional message') \g /dev/null

-- 10. Another DDL-only (empty) transaction, then the end marker.
COMMENT ON TABLE customers IS 'lanestream workload';
BEGIN;
INSERT INTO audit_log VALUES (now(), 'workload', 'end-of-workload', NULL);
SELECT pg_logical_emit_message(true, 'lanestream', 'end-of-workload') \g /dev/null
COMMIT;
SQL
}

# Builds the lanestream-pipeline harness of the checkout at $1 (release) and prints its path;
# with PIPELINE set, prints that instead (a harness built elsewhere: a before/after pair).
pg_build_harness() {
    if [[ -n ${PIPELINE:-} ]]; then
        echo "$PIPELINE"
        return
    fi
    pg_log "building the pipeline harness, the lanestream-pipeline binary (lanestream-postgres, release)"
    (cd "$1" && cargo build --release --quiet -p lanestream-postgres --bin lanestream-pipeline)
    local target_dir
    target_dir=$(cd "$1" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    echo "$target_dir/release/lanestream-pipeline"
}

# The load average (1, 5, 15 min).
pg_load() { cut -d' ' -f1-3 /proc/loadavg; }

# A field of a harness summary JSON ($1: file, $2: a Python expression on `s`).
pg_summary_field() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print($2)" "$1"; }
