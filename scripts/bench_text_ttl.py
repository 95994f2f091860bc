#!/usr/bin/env python3
"""`$text` queries/s and the TTL monitor's deletion rate over the wire
(issue #18's benchmark; figures in BENCHMARKS.md, "Index builds").

    .venv/bin/python scripts/bench_text_ttl.py text 1000000
    .venv/bin/python scripts/bench_text_ttl.py ttl 200000

Starts `duet serve` ($DUET_BIN, default target/release/duet) on a free
loopback port with a temporary data directory, loads N documents with
pymongo, measures, and stops the server. Not part of the test suite.
"""
import datetime
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

from pymongo import MongoClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUET = os.environ.get("DUET_BIN", os.path.join(ROOT, "target", "release", "duet"))


def serve(*extra):
    d = tempfile.mkdtemp()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([DUET, "serve", "--port", str(port), "--data-dir", d + "/data",
                          "--log-level", "warn", *extra], stdout=subprocess.PIPE)
    p.stdout.readline()  # "duet serve listening on ..."
    return p, MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")


def text(n):
    random.seed(1)
    vocab = ["w%04d" % i for i in range(5000)]
    p, c = serve()
    coll = c.t.docs
    for i in range(0, n, 10000):
        coll.insert_many([{"_id": j, "body": " ".join(random.choices(vocab, k=8))}
                          for j in range(i, min(i + 10000, n))])
    t0 = time.time()
    coll.create_index([("body", "text")])
    print(f"N={n}: text index build {time.time() - t0:.1f} s")
    for kind in ["one word", "two words (either)", "phrase of two words"]:
        done = hits = 0
        t0 = time.time()
        while time.time() - t0 < 5:
            a, b = random.choice(vocab), random.choice(vocab)
            q = {"one word": a, "two words (either)": f"{a} {b}", "phrase of two words": f'"{a} {b}"'}[kind]
            score = {"score": {"$meta": "textScore"}}
            hits += len(list(coll.find({"$text": {"$search": q}}, score).sort([("score", {"$meta": "textScore"})]).limit(10)))
            done += 1
        print(f"  {kind}: {done / (time.time() - t0):.0f} queries/s, {hits / done:.1f} results each")
    c.close()
    p.terminate()
    p.wait()


def ttl(n):
    p, c = serve("--ttl-monitor-sleep-secs", "1")
    coll = c.t.sessions
    old = datetime.datetime(2020, 1, 1)
    for i in range(0, n, 10000):
        coll.insert_many([{"_id": j, "at": old, "pad": "x" * 150} for j in range(i, min(i + 10000, n))])
    t0 = time.time()
    coll.create_index("at", expireAfterSeconds=0)
    samples = []
    while True:
        left = coll.estimated_document_count()
        samples.append((time.time() - t0, left))
        if left == 0 or time.time() - t0 > 300:
            break
        time.sleep(0.2)
    first = next((t for t, left in samples if left < n), samples[-1][0])
    took = max(samples[-1][0] - first, 1e-9)
    stats = c.admin.command("serverStatus")["metrics"]["ttl"]
    print(f"N={n}: first deletion after {first:.2f} s, {samples[-1][1]} left after {samples[-1][0]:.2f} s, "
          f"{n / took:.0f} deletions/s; serverStatus ttl {stats}")
    c.close()
    p.terminate()
    p.wait()


if __name__ == "__main__":
    {"text": text, "ttl": ttl}[sys.argv[1]](int(sys.argv[2]))
