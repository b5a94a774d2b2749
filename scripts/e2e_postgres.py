#!/usr/bin/env python3
"""Helpers of scripts/e2e-postgres.sh (the crash test of the live PostgreSQL source).

  writer KIND SECONDS SEED   print an endless stream of SQL for one concurrent writer (psql runs it)
                             for SECONDS; KIND: accounts | keyless | docs | events | scratch | bulk
                             | rekey (key DDL mid-run: the key column renamed, then the key
                             redefined with a second column)
  poller OUTDIR SINKS STOPFILE SAMPLES
                             until STOPFILE exists: read pg_replication_slots.confirmed_flush_lsn,
                             then every sink's durable checkpoint (OUTDIR/<sink>.checkpoint), and
                             write "confirmed lowest-applied" per read to SAMPLES (a sink without a
                             checkpoint has applied nothing past the slot's creation); prints the
                             number of reads
  violations SAMPLES STREAM  count the reads where the slot was confirmed past a commit that a sink
                             had not durably applied: a commit LSN c of STREAM (the full change list)
                             with applied < c < confirmed (an idle slot is confirmed past the last
                             commit, up to where it decoded: no violation while no commit lies
                             between); prints "reads violations"
  replay NDJSON TABLEDUMP    replay a sink's output (the sink rules: upserts replace but keep unchanged columns, deletes, truncates) and compare
                             with the table contents (TABLEDUMP: lines "index<TAB>row json")
  positions NDJSON           check the output holds each transaction once, in commit order
  applied CHECKPOINT         print where a durable sink's data stands (its state's LSN, or -)

The SQL uses only integer and text columns, so a row as JSON compares exactly with its documents.
"""
import json
import os
import random
import subprocess
import sys
import time


def lsn(text):
    hi, lo = text.strip().split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def writer(kind, seconds, seed):
    rng = random.Random(seed)
    end = time.time() + seconds
    n = 0
    out = sys.stdout
    out.write("SET client_min_messages = error;\n")
    while time.time() < end:
        n += 1
        i = rng.randint(1, 400)
        roll = rng.random()
        if kind == "accounts":  # primary key: inserts, updates, deletes, key changes
            if roll < 0.4:
                out.write(f"INSERT INTO accounts VALUES ({i}, 'n{i}', {n}) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance;\n")
            elif roll < 0.7:
                out.write(f"UPDATE accounts SET balance = balance + 1, name = name || '.' WHERE id = {i};\n")
            elif roll < 0.85:
                out.write(f"DELETE FROM accounts WHERE id = {i};\n")
            else:  # a primary-key change (moved rows live above 100000, so never collide)
                out.write(f"UPDATE accounts SET id = id + 100000 WHERE id = (SELECT min(id) FROM accounts WHERE id % 400 = {i % 400});\n")
        elif kind == "keyless":  # no primary key, REPLICA IDENTITY USING INDEX (email)
            e = f"e{i}@x"
            if roll < 0.4:
                out.write(f"INSERT INTO keyless VALUES ('{e}', 'k{i}', {n}) ON CONFLICT (email) DO UPDATE SET balance = excluded.balance;\n")
            elif roll < 0.7:
                out.write(f"UPDATE keyless SET balance = balance + 1 WHERE email = '{e}';\n")
            elif roll < 0.85:
                out.write(f"DELETE FROM keyless WHERE email = '{e}';\n")
            else:  # an identity change: errors (a taken email) are ignored by psql
                out.write(f"UPDATE keyless SET email = email || '.{n}' WHERE email = '{e}';\n")
        elif kind == "docs":  # a TOASTed column (stored externally) left out of most updates
            if roll < 0.3:
                out.write(
                    f"INSERT INTO docs SELECT {i}, 't{n}', string_agg(md5(({n} * 1000 + j)::text), ' ') "
                    f"FROM generate_series(1, 120) j ON CONFLICT (id) DO UPDATE SET body = excluded.body;\n")
            elif roll < 0.85:
                out.write(f"UPDATE docs SET title = 't{n}' WHERE id = {i};\n")
            else:
                out.write(f"DELETE FROM docs WHERE id = {i};\n")
        elif kind == "events":  # no key at all, REPLICA IDENTITY FULL; multi-statement transactions
            k = f"{seed}-{n}"
            out.write("BEGIN;\n")
            out.write(f"INSERT INTO events VALUES ('{k}', {i}, NULL), ('{k}-b', NULL, 'null');\n")
            if roll < 0.5:
                out.write(f"UPDATE events SET n = coalesce(n, 0) + 1 WHERE k = '{seed}-{max(1, n - rng.randint(1, 20))}';\n")
            else:
                out.write(f"DELETE FROM events WHERE k = '{seed}-{max(1, n - rng.randint(1, 20))}-b';\n")
            out.write("COMMIT;\n")
        elif kind == "scratch":  # inserts, and a truncate now and then
            if roll < 0.05:
                out.write("TRUNCATE scratch;\n")
            else:
                out.write(f"INSERT INTO scratch VALUES ({n}, {i}) ON CONFLICT (id) DO NOTHING;\n")
        elif kind == "rekey":  # the key column renamed, then the key redefined, mid-run
            phase = 0 if time.time() < end - seconds * 2 / 3 else 1 if time.time() < end - seconds / 3 else 2
            if phase != getattr(writer, "phase", 0):
                # Each DDL with a delete of every row (under the old key), so that the sinks'
                # replay compares with the table whatever the old documents looked like.
                if phase == 1:
                    out.write("BEGIN; DELETE FROM rekey; ALTER TABLE rekey RENAME COLUMN id TO rid; COMMIT;\n")
                else:
                    out.write("BEGIN; DELETE FROM rekey; ALTER TABLE rekey DROP CONSTRAINT rekey_pkey, ADD PRIMARY KEY (rid, k); COMMIT;\n")
                writer.phase = phase
            col = "id" if phase == 0 else "rid"
            k = rng.randint(1, 2) if phase == 2 else 1
            conflict = f"({col}, k)" if phase == 2 else f"({col})"
            if roll < 0.6:
                out.write(f"INSERT INTO rekey VALUES ({i % 50}, {k}, {n}) ON CONFLICT {conflict} DO UPDATE SET v = excluded.v;\n")
            elif roll < 0.85:
                out.write(f"UPDATE rekey SET v = v + 1 WHERE {col} = {i % 50};\n")
            else:
                out.write(f"DELETE FROM rekey WHERE {col} = {i % 50} AND k = {k};\n")
        elif kind == "bulk":  # a few large transactions (published in chunks)
            out.write(f"INSERT INTO bulk SELECT {n} * 100000 + g, md5(g::text) FROM generate_series(1, 6000) g;\n")
            out.write(f"DELETE FROM bulk WHERE id < {n} * 100000 AND id % 3 = 0;\n")
            out.flush()
            time.sleep(4)
        else:
            raise SystemExit(f"unknown writer {kind}")
        # About 100 statements a second per writer: a load the slow sink keeps up with.
        out.flush()
        time.sleep(0.01)
    out.flush()


def psql(sql):
    r = subprocess.run([os.environ.get("PSQL", "psql"), "-X", "-Atqc", sql], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip())
    return r.stdout.strip()


def checkpoint_applied(text, before):
    """Where a durable NDJSON sink's data stands, from its checkpoint ("ndjson 2 LENGTH" then
    its sink state as JSON: the last whole transaction, or just before one applied in part);
    `before` when it applied none."""
    lines = text.splitlines()
    state = json.loads(lines[1])
    if "position" in state:
        return lsn(state["position"])
    if "in_transaction" in state:
        return lsn(state["in_transaction"][0]) - 1
    return before


def poller(outdir, sinks, stopfile, samples):
    baseline = None
    checks = 0
    with open(samples, "w") as f:
        while not os.path.exists(stopfile):
            try:
                confirmed = psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'lanestream'")
            except RuntimeError as e:
                f.write(f"# psql: {e}\n")
                time.sleep(0.1)
                continue
            if not confirmed:
                time.sleep(0.1)
                continue
            confirmed = lsn(confirmed)
            if baseline is None:
                baseline = confirmed  # the slot's creation point: nothing confirmed yet
            # Read after the slot: a checkpoint only moves forward, so a sink that had applied
            # less than `confirmed` when it was read would still show less now.
            applied = {}
            for sink in sinks.split(","):
                try:
                    with open(os.path.join(outdir, f"{sink}.checkpoint")) as c:
                        applied[sink] = checkpoint_applied(c.read(), baseline)
                except FileNotFoundError:
                    applied[sink] = baseline
            checks += 1
            f.write(f"{confirmed} {min(applied.values())}\n")
            time.sleep(0.05)
    print(checks)


def violations(samples, stream):
    commits = []
    with open(stream) as f:
        for line in f:
            if line.startswith('{"action":"C"'):
                commits.append(lsn(json.loads(line)["lsn"]))
    commits.sort()
    import bisect
    reads = bad = 0
    with open(samples) as f:
        for line in f:
            if line.startswith("#"):
                continue
            confirmed, applied = map(int, line.split())
            reads += 1
            # A commit c with applied < c < confirmed: confirmed past a transaction not applied.
            i = bisect.bisect_right(commits, applied)
            if i < len(commits) and commits[i] < confirmed:
                bad += 1
                if bad <= 5:
                    print(f"VIOLATION: confirmed {confirmed:X} past commit {commits[i]:X}, applied only {applied:X}", file=sys.stderr)
    print(reads, bad)


def replay(ndjson, tabledump):
    state = {}
    with open(ndjson) as f:
        for line in f:
            e = json.loads(line)
            rows = state.setdefault(e["index"], {})
            if e["op"] == "upsert":
                # The sink rules: replace, keeping a partial update's unchanged columns from
                # the row held at its old id (a key change) or its id.
                held = rows.get(e.get("old_id") or e["id"], {})
                row = {c: held[c] for c in e.get("unchanged", []) if c in held}
                row.update(e["document"])
                rows[e["id"]] = row
            elif e["op"] == "delete":
                rows.pop(e["id"], None)
            elif e["op"] == "truncate":
                rows.clear()
    want = {}
    with open(tabledump) as f:
        for line in f:
            index, row = line.rstrip("\n").split("\t", 1)
            want.setdefault(index, []).append(json.dumps(json.loads(row), sort_keys=True))
    bad = 0
    for index in sorted(set(want) | set(state)):
        got = sorted(json.dumps(d, sort_keys=True) for d in state.get(index, {}).values())
        exp = sorted(want.get(index, []))
        if got != exp:
            bad += 1
            missing = set(exp) - set(got)
            extra = set(got) - set(exp)
            print(f"{ndjson}: {index}: {len(got)} rows replayed, {len(exp)} in the table; "
                  f"missing e.g. {sorted(missing)[:2]}, extra e.g. {sorted(extra)[:2]}")
    rows = sum(len(v) for v in want.values())
    if bad == 0:
        print(f"{ndjson}: replayed output equals the {rows} rows of {len(want)} tables")
    return bad


def positions(ndjson):
    """Each transaction's lines are one run, runs in strictly increasing commit order."""
    last = None
    runs = 0
    with open(ndjson) as f:
        for line in f:
            p = lsn(json.loads(line)["position"])
            if p != last:
                if last is not None and p < last:
                    print(f"{ndjson}: position {p:X} after {last:X}: a transaction applied twice or out of order")
                    return 1
                last = p
                runs += 1
    print(f"{ndjson}: {runs} transactions with changes, each once, in commit order")
    return 0


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "applied":
        p = checkpoint_applied(open(args[0]).read(), None)
        print("-" if p is None else f"{p >> 32:X}/{p & 0xFFFFFFFF:X}")
        sys.exit(0)
    if cmd == "writer":
        writer(args[0], float(args[1]), int(args[2]))
    elif cmd == "poller":
        poller(*args)
    elif cmd == "violations":
        violations(*args)
    elif cmd == "replay":
        sys.exit(1 if replay(*args) else 0)
    elif cmd == "positions":
        sys.exit(positions(args[0]))
    else:
        raise SystemExit(__doc__)
