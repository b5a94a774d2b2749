#!/usr/bin/env python3
"""Checks the libraries' MSRV against what they are built from.

`rust-version` in the Cargo.toml of the core (`lanestream`) and of the event log
(`lanestream-log`) is each library's minimum supported Rust. For each, this script lists its
normal and build dependency closure with every feature on, as locked in Cargo.lock
(`cargo tree`), and fails if any package there declares a higher `rust-version`.
Clippy's `incompatible_msrv` lint (run by CI with `-D warnings`) checks our own code against the
same number. Usage: scripts/msrv.py
"""
import json
import subprocess
import sys


def version(v):
    parts = [int(x) for x in (v or "0").split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "--format-version", "1", "--locked"], text=True))
declared = {(p["name"], p["version"]): p.get("rust_version") for p in meta["packages"]}
failed = False
for crate in ["lanestream", "lanestream-log"]:
    msrv_text = declared[(crate, next(p["version"] for p in meta["packages"] if p["name"] == crate))]
    tree = subprocess.check_output(
        ["cargo", "tree", "-p", crate, "--all-features", "-e", "normal,build", "--prefix", "none",
         "--format", "{p}", "--locked"], text=True)
    closure = set()
    for line in tree.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] != crate:
            closure.add((parts[0], parts[1].lstrip("v")))
    bad = [f"{n} {v} needs {declared.get((n, v))}" for n, v in sorted(closure)
           if version(declared.get((n, v))) > version(msrv_text)]
    if bad:
        print(f"msrv: {crate} declares {msrv_text} but depends on:", *bad, sep="\n  ")
        failed = True
    else:
        print(f"msrv: {crate}: {len(closure)} dependencies (all features, as locked) build on {msrv_text}")
sys.exit(1 if failed else 0)
