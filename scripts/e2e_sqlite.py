#!/usr/bin/env python3
"""The SQLite replica (postgres/examples/sqlite_replica.rs) against the PostgreSQL tables, row by
row and column by column: scripts/e2e-sqlite.sh's checks.

    e2e_sqlite.py count SQLITE TABLE          rows of TABLE in the replica (0 if it has none yet)
    e2e_sqlite.py state SQLITE                the replica's checkpoint (the SinkState text), or ""
    e2e_sqlite.py compare SQLITE TABLE...     every PostgreSQL TABLE (schema.name) against the
                                              replica's schema_name: prints the counts, then
                                              PASS or FAIL (exit status 1)

PostgreSQL is read with psql ($PSQL, default "psql"; the connection from the PG* environment) in
its text output. Both sides are normalised the same way before comparing, as text: NULL stays
NULL; bool is 1 / 0 (SQLite holds it as INTEGER); float4 / float8 are compared as Python floats
(repr: SQLite holds REAL); integers as their decimal text; everything else (numeric included,
held as TEXT) exactly as PostgreSQL writes it.
"""
import os
import sqlite3
import subprocess
import sys

FS, RS = "\x1f", "\x1e"


def psql(sql):
    out = subprocess.run(
        [os.environ.get("PSQL", "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", "-F", FS, "-R", RS,
         "-P", "null=\x02", "-c", sql],
        check=True, capture_output=True, text=True).stdout
    if out.endswith("\n"):
        out = out[:-1]
    return [[None if v == "\x02" else v for v in rec.split(FS)] for rec in out.split(RS) if rec != ""]


def norm_pg(value, typ):
    if value is None:
        return None
    if typ == "bool":
        return {"t": "1", "f": "0"}[value]
    if typ in ("float4", "float8"):
        return repr(float(value))
    if typ in ("int2", "int4", "int8"):
        return str(int(value))
    return value


def norm_sqlite(value):
    if value is None:
        return None
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def connect(path):
    # Read only: the replica may still be running (WAL mode lets both be).
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def count(path, table):
    try:
        return connect(path).execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    except sqlite3.Error:
        return 0


def state(path):
    try:
        row = connect(path).execute("SELECT state FROM _lanestream_state").fetchone()
        return row[0] if row else ""
    except sqlite3.Error:
        return ""


def compare(path, tables):
    db = connect(path)
    compared = missing = wrong = extra = 0
    problems = []
    for table in tables:
        schema, name = table.split(".")
        columns = psql(f"SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
                       f"WHERE a.attrelid = '{table}'::regclass AND a.attnum > 0 AND NOT a.attisdropped "
                       f"ORDER BY a.attnum")
        keys = [k for (k,) in psql(f"SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                                   f"AND a.attnum = ANY (i.indkey) WHERE i.indrelid = '{table}'::regclass "
                                   f"AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)")]
        names = [c for c, _ in columns]
        lite = f"{schema}_{name}".lower()
        have = [r[1] for r in db.execute(f'PRAGMA table_info("{lite}")')]
        if have != names:
            problems.append(f"{table}: columns {names} in PostgreSQL, {have} in SQLite")
            continue
        key_at = [names.index(k) for k in keys]
        quoted = ", ".join(f'"{c}"' for c in names)
        pg = {}
        for rec in psql(f"SELECT {quoted} FROM {table}"):
            row = tuple(norm_pg(v, t) for v, (_, t) in zip(rec, columns))
            pg[tuple(row[i] for i in key_at)] = row
        sq = {}
        for rec in db.execute(f'SELECT {quoted} FROM "{lite}"'):
            row = tuple(norm_sqlite(v) for v in rec)
            sq[tuple(row[i] for i in key_at)] = row
        t_missing = t_wrong = 0
        for key, row in pg.items():
            compared += 1
            held = sq.get(key)
            if held is None:
                t_missing += 1
            elif held != row:
                t_wrong += 1
                if t_wrong <= 3:
                    cols = [n for n, a, b in zip(names, row, held) if a != b]
                    problems.append(f"{table} {key}: differs in {cols}: "
                                    + "; ".join(f"{n}: pg {str(a)[:40]!r} sqlite {str(b)[:40]!r}"
                                                for n, a, b in zip(names, row, held) if a != b))
        t_extra = sum(1 for key in sq if key not in pg)
        problems.extend(f"{table} {key}: missing" for key in [k for k in pg if k not in sq][:3])
        problems.extend(f"{table} {key}: extra" for key in [k for k in sq if k not in pg][:3])
        print(f"{table}: {len(pg)} rows, {len(names)} columns ({', '.join(names)}): "
              f"missing {t_missing}, wrong {t_wrong}, extra {t_extra}")
        missing, wrong, extra = missing + t_missing, wrong + t_wrong, extra + t_extra
    applied, distinct = db.execute("SELECT count(*), count(DISTINCT position) FROM _lanestream_applied").fetchone()
    for p in problems:
        print("  " + p)
    print(f"rows compared {compared}, missing {missing}, wrong {wrong}, extra {extra}; "
          f"transactions applied {applied} ({distinct} distinct positions: none applied twice)")
    ok = missing == wrong == extra == 0 and not problems and applied == distinct
    print(("PASS: " if ok else "FAIL: ") + f"the SQLite replica {'equals' if ok else 'differs from'} "
          f"the PostgreSQL tables ({compared} rows compared)")
    return 0 if ok else 1


if __name__ == "__main__":
    cmd, path, *rest = sys.argv[1:]
    if cmd == "count":
        print(count(path, rest[0]))
    elif cmd == "state":
        print(state(path))
    elif cmd == "compare":
        sys.exit(compare(path, rest))
    else:
        sys.exit(f"unknown command {cmd}")
