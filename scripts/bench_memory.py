#!/usr/bin/env python3
"""Resident memory per document of a `duet serve` process (issue #20 item 7).

Starts `duet serve` (DUET_BIN, default target/release/duet) on an empty data
directory, loads N documents `{_id: ObjectId, k: int, s: "x"*150, a: int,
b: "v<n>"}` (209 BSON bytes) with pymongo `insert_many` in batches of 10,000,
and reads VmRSS from /proc before and 1 s after the load; then creates
indexes on `a`, `b`, `k` and reads it again.

    .venv/bin/python scripts/bench_memory.py [N]
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bson import ObjectId
from pymongo import MongoClient

ROOT = Path(__file__).resolve().parents[1]
DUET = os.environ.get("DUET_BIN", str(ROOT / "target" / "release" / "duet"))


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    tmp = tempfile.mkdtemp(prefix="duet-mem-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [DUET, "serve", "--bind", "127.0.0.1", "--port", str(port), "--data-dir", f"{tmp}/data"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        c = MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
        coll = c.mem.docs
        time.sleep(1)
        empty = rss(proc.pid)
        pad = "x" * 150
        for start in range(0, n, 10_000):
            coll.insert_many([{"_id": ObjectId(), "k": i, "s": pad, "a": i * 7919 % 1_000_003,
                               "b": f"v{i % 100_000}"} for i in range(start, min(start + 10_000, n))],
                             ordered=False)
        time.sleep(1)
        loaded = rss(proc.pid)
        data = c.mem.command("collStats", "docs")["size"]
        for field in ("a", "b", "k"):
            coll.create_index(field)
        time.sleep(1)
        indexed = rss(proc.pid)
        print(f"documents {n}, BSON bytes {data} ({data / n:.1f} per document)")
        print(f"RSS empty {empty / 2**20:.1f} MiB; after the load +{(loaded - empty) / 2**20:.1f} MiB "
              f"({(loaded - empty) / n:.0f} B/doc, {(loaded - empty) / data:.2f}x the BSON bytes); "
              f"after 3 indexes +{(indexed - loaded) / 2**20:.1f} MiB "
              f"({(indexed - loaded) / n / 3:.0f} B per index entry)")
        c.close()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
