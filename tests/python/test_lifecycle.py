"""Server lifecycle: connection limit with a clear refusal, graceful shutdown on SIGTERM/SIGINT."""

import signal
import threading

import pytest
from pymongo.errors import PyMongoError


def test_connection_limit_refuses_clearly(make_server):
    # No administrator slots: a third loopback client must be refused.
    srv = make_server("--max-connections", "2", "--admin-connections", "0")
    import time
    import wire
    time.sleep(0.3)  # let the start-up probe connection close
    a, b = wire.connect(srv.port), wire.connect(srv.port)
    assert wire.command(a, {"ping": 1, "$db": "admin"})["ok"] == 1.0
    assert wire.command(b, {"ping": 1, "$db": "admin"})["ok"] == 1.0
    c = wire.connect(srv.port)
    r = wire.command(c, {"hello": 1, "$db": "admin"})
    assert r["ok"] == 0.0 and "limit of 2 connections" in r["errmsg"]
    assert wire.is_closed(c)
    a.close()
    time.sleep(0.3)
    d = wire.connect(srv.port)
    assert wire.command(d, {"ping": 1, "$db": "admin"})["ok"] == 1.0
    assert "connection refused" in srv.log_text()
    b.close()
    d.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown(make_server, sig):
    srv = make_server()
    client = srv.client()
    client.t.c.insert_many([{"i": i} for i in range(1000)])
    results = []

    def reader():
        try:
            for _ in range(50):
                results.append(client.t.c.count_documents({}))
        except PyMongoError as e:
            results.append(e)

    t = threading.Thread(target=reader)
    t.start()
    code = srv.stop(sig)
    t.join()
    client.close()
    assert code == 0
    assert "shutting down" in srv.log_text()
    assert all(r == 1000 for r in results if isinstance(r, int))


def test_data_survives_a_restart(tmp_path):
    """`duet serve --data-dir` keeps what it acknowledged across a restart."""
    import subprocess, socket, time, pathlib
    import pymongo

    root = pathlib.Path(__file__).resolve().parents[2]
    binary = root / "target" / "debug" / "duet"

    def free_port():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    def start(port):
        p = subprocess.Popen([str(binary), "serve", "--bind", "127.0.0.1", "--port", str(port),
                              "--data-dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return p
            except OSError:
                time.sleep(0.05)
        p.kill()
        raise RuntimeError("server did not start")

    port = free_port()
    p = start(port)
    try:
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
        c.keep.c.insert_many([{"_id": i, "v": i * 2} for i in range(500)])
        c.keep.c.create_index("v", unique=True)
        c.keep.c.update_one({"_id": 7}, {"$set": {"v": -1}})
        c.close()
    finally:
        p.terminate()
        assert p.wait(timeout=20) == 0
    port = free_port()
    p = start(port)
    try:
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
        assert c.keep.c.count_documents({}) == 500
        assert c.keep.c.find_one({"_id": 7})["v"] == -1
        assert [ix["name"] for ix in c.keep.c.list_indexes()] == ["_id_", "v_1"]
        c.close()
    finally:
        p.terminate()
        p.wait(timeout=20)
