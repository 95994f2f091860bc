"""Issue 14, item 1, as the issue reported it: 100 documents inserted with
`j: true`, the server stopped, the newest `wal-*.log` deleted — the server
used to start with 0 documents and log nothing. Now it refuses to start, and
says which file is missing."""

import pathlib
import socket
import subprocess
import time

import pymongo

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "debug" / "duet"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(data_dir, port):
    return subprocess.Popen(
        [str(BINARY), "serve", "--bind", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_listening(p, port):
    deadline = time.time() + 20
    while time.time() < deadline:
        if p.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("server neither started nor exited")


def test_a_deleted_newest_segment_stops_the_server_naming_it(tmp_path):
    port = free_port()
    p = start(tmp_path, port)
    assert wait_listening(p, port)
    try:
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
        coll = c.get_database("shop").get_collection(
            "c", write_concern=pymongo.WriteConcern(j=True))
        for i in range(100):
            coll.insert_one({"_id": i, "pad": "x" * 100})
        c.close()
    finally:
        p.terminate()
        p.communicate(timeout=20)
    segments = sorted(tmp_path.rglob("wal-*.log"))
    assert segments, list(tmp_path.rglob("*"))
    newest = segments[-1]
    newest.unlink()

    port = free_port()
    p = start(tmp_path, port)
    started = wait_listening(p, port)
    if started:
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
        n = c.shop.c.count_documents({})
        c.close()
        p.terminate()
        p.communicate(timeout=20)
        raise AssertionError(f"started with {n} of 100 acknowledged documents")
    _, err = p.communicate(timeout=20)
    assert p.returncode != 0
    assert newest.name in err and "missing" in err, err
