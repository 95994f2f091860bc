"""Server lifecycle: connection limit with a clear refusal, graceful shutdown on SIGTERM/SIGINT."""

import signal
import threading

import pytest
from pymongo.errors import PyMongoError


def test_connection_limit_refuses_clearly(make_server):
    srv = make_server("--max-connections", "2")
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
