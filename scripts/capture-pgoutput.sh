#!/usr/bin/env bash
# Captures the same transactions twice from a throwaway PostgreSQL 15 cluster: as pgoutput
# (protocol version 1, the bytes of each message as the server sends them in XLogData) and as
# wal2json format-version 2, for lanestream-postgres's pgoutput decoder tests
# (postgres/src/pgoutput.rs): the decoder's batches over the pgoutput capture are checked against
# the wal2json reader's batches over the wal2json capture of the same transactions, and against
# the checked-in expected batches.
#
# Two slots (pgoutput and wal2json) are created one after the other before the workload, so both
# decode the same transactions; a publication FOR ALL TABLES names the tables for pgoutput. The
# workload covers every pgoutput message of protocol version 1 (Begin, Relation, Type, Insert,
# Update with and without the old key, Delete under DEFAULT / FULL / USING INDEX identities,
# Truncate of two tables, Commit, logical Message inside and outside a transaction; Origin needs a
# replication origin: set with pg_replication_origin_session_setup), column types as JSON
# (integers, numeric with NaN, float, bool, bytea, text with JSON-hostile characters, jsonb,
# arrays, NULL, a user-defined enum type: a Type message), an unchanged TOASTed value, a key
# change, DDL between changes (ADD / DROP / RENAME COLUMN, ALTER TYPE, REPLICA IDENTITY changes, a
# new table) and one transaction of 25 changes (the tests chunk it).
#
# Writes postgres/tests/data/pgoutput-capture.hex (one message a line: the LSN the server gives
# it, a space, its bytes in hex) and postgres/tests/data/pgoutput-capture.wal2json.jsonl. The
# expected batches are written by the decoder's test when LANESTREAM_BLESS=1 (see there).
#
# Usage: scripts/capture-pgoutput.sh [OUTPUT_DIR]
#        scripts/capture-pgoutput.sh --workload [OUTPUT_DIR]
#   --workload: instead, the realistic workload of scripts/pg-common.sh (PG_WORKLOAD_SCALE, 1 by
#   default here) through both plugins, for postgres/benches/ingest.rs (the decoder against the
#   wal2json reader on the same changes): postgres/benches/data/workload.pgoutput.gz (each message
#   as a 4-byte big-endian length, then its bytes) and workload.wal2json.jsonl.gz.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/pg-common.sh
source "$here/pg-common.sh"

workload=0
if [[ ${1:-} == --workload ]]; then
    workload=1
    shift
fi
if ((workload)); then
    out=${1:-$(dirname "$here")/postgres/benches/data}
else
    out=${1:-$(dirname "$here")/postgres/tests/data}
fi

pg_ensure_packages
pg_start
if ((workload)); then
    pg_psql -c "CREATE PUBLICATION lanestream FOR ALL TABLES" \
        -c "SELECT pg_create_logical_replication_slot('cap_pgoutput', 'pgoutput')" \
        -c "SELECT pg_create_logical_replication_slot('cap_wal2json', 'wal2json')" >/dev/null
    pg_log "running the workload (scale ${PG_WORKLOAD_SCALE:=1})"
    pg_workload
    mkdir -p "$out"
    pg_psql -Atc "SELECT encode(data, 'hex') FROM pg_logical_slot_peek_binary_changes('cap_pgoutput', NULL, NULL,
        'proto_version', '1', 'publication_names', 'lanestream', 'messages', 'true')" |
        python3 -c 'import sys, struct
out = sys.stdout.buffer
for line in sys.stdin:
    m = bytes.fromhex(line.strip())
    out.write(struct.pack(">I", len(m)) + m)' | gzip -9 -n >"$out/workload.pgoutput.gz"
    pg_psql -Atc "SELECT data FROM pg_logical_slot_peek_changes('cap_wal2json', NULL, NULL,
        'format-version', '2', 'include-lsn', 'true', 'include-xids', 'true', 'include-pk', 'true')" |
        gzip -9 -n >"$out/workload.wal2json.jsonl.gz"
    pg_log "wrote $out/workload.pgoutput.gz ($(stat -c %s "$out/workload.pgoutput.gz") bytes) and workload.wal2json.jsonl.gz ($(stat -c %s "$out/workload.wal2json.jsonl.gz") bytes)"
    exit 0
fi
pg_psql -c "CREATE PUBLICATION lanestream FOR ALL TABLES" \
    -c "SELECT pg_create_logical_replication_slot('cap_pgoutput', 'pgoutput')" \
    -c "SELECT pg_create_logical_replication_slot('cap_wal2json', 'wal2json')" \
    -c "SELECT pg_replication_origin_create('upstream')" >/dev/null
pg_log "running the capture workload"
pg_psql <<'SQL'
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE items (id integer PRIMARY KEY, n bigint, small smallint, price numeric(10,2),
    ratio double precision, f4 real, ok boolean, raw bytea, note text, doc jsonb, tags text[],
    feeling mood, at timestamptz);
CREATE TABLE docs (id integer PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL;
CREATE TABLE full_rows (a integer, b text);
ALTER TABLE full_rows REPLICA IDENTITY FULL;
CREATE TABLE by_index (id integer NOT NULL, code text NOT NULL, v integer);
CREATE UNIQUE INDEX by_index_code ON by_index (code);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_code;
CREATE TABLE pair (a integer, b integer, v text, PRIMARY KEY (a, b));

INSERT INTO items VALUES
  (1, 9007199254740993, -3, 12.50, 0.1, 1.5, true, '\x00ff10', 'plain', '{"k": [1, null, "x"]}',
   ARRAY['a', 'b c'], 'happy', '2024-01-02 03:04:05.123456+00'),
  (2, NULL, NULL, 'NaN', 'Infinity', '-Infinity', false, '', E'quote " back\\ tab\t nl\n ctl\x01 é 🚀',
   NULL, '{}', NULL, NULL),
  (3, 0, 0, -0.01, 1e300, 0, NULL, NULL, '', 'null', NULL, 'sad', NULL);
BEGIN;
UPDATE items SET note = 'changed', ok = NOT ok WHERE id = 1;
UPDATE items SET id = 10 WHERE id = 3;
DELETE FROM items WHERE id = 2;
COMMIT;
INSERT INTO docs SELECT 1, 'first', string_agg(md5(j::text), ' ') FROM generate_series(1, 300) j;
UPDATE docs SET title = 'renamed' WHERE id = 1;
INSERT INTO full_rows VALUES (1, 'one'), (2, 'two');
UPDATE full_rows SET b = 'uno' WHERE a = 1;
DELETE FROM full_rows WHERE a = 2;
INSERT INTO by_index VALUES (1, 'x', 10), (2, 'y', 20);
UPDATE by_index SET v = 11 WHERE code = 'x';
UPDATE by_index SET code = 'z' WHERE code = 'y';
DELETE FROM by_index WHERE code = 'x';
INSERT INTO pair SELECT i, i % 3, 'v' || i FROM generate_series(1, 25) i;
-- DDL between changes: the decoder must take the new shape from the next change on.
ALTER TABLE pair ADD COLUMN extra integer DEFAULT 7;
INSERT INTO pair VALUES (100, 1, 'after add', 8);
ALTER TABLE pair DROP COLUMN v;
UPDATE pair SET extra = 9 WHERE a = 100;
ALTER TABLE pair RENAME COLUMN extra TO bonus;
ALTER TABLE pair ALTER COLUMN bonus TYPE text;
UPDATE pair SET bonus = 'ten' WHERE a = 100;
ALTER TABLE full_rows REPLICA IDENTITY DEFAULT;
ALTER TABLE full_rows ADD PRIMARY KEY (a);
UPDATE full_rows SET b = 'ein' WHERE a = 1;
DELETE FROM full_rows WHERE a = 1;
CREATE TABLE later (k text PRIMARY KEY);
INSERT INTO later VALUES ('new table');
BEGIN;
INSERT INTO later VALUES ('with message');
SELECT pg_logical_emit_message(true, 'lanestream', 'transactional') \g /dev/null
COMMIT;
SELECT pg_logical_emit_message(false, 'lanestream', 'non-transactional') \g /dev/null
TRUNCATE later, by_index;
SELECT pg_replication_origin_session_setup('upstream') \g /dev/null
INSERT INTO later VALUES ('from an origin');
SELECT pg_replication_origin_session_reset() \g /dev/null
INSERT INTO later VALUES ('end');
SQL
mkdir -p "$out"
pg_psql -Atc "SELECT lsn || ' ' || encode(data, 'hex') FROM pg_logical_slot_peek_binary_changes(
    'cap_pgoutput', NULL, NULL, 'proto_version', '1', 'publication_names', 'lanestream',
    'messages', 'true')" >"$out/pgoutput-capture.hex"
pg_psql -Atc "SELECT data FROM pg_logical_slot_peek_changes('cap_wal2json', NULL, NULL,
    'format-version', '2', 'include-lsn', 'true', 'include-xids', 'true', 'include-pk', 'true')" \
    >"$out/pgoutput-capture.wal2json.jsonl"
grep -q "$(printf 'end' | od -An -tx1 | tr -d ' \n')" "$out/pgoutput-capture.hex" ||
    pg_die "the last insert is not in the pgoutput capture"
pg_log "wrote $out: $(wc -l <"$out/pgoutput-capture.hex") pgoutput messages, $(wc -l <"$out/pgoutput-capture.wal2json.jsonl") wal2json lines"
