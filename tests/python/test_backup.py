"""Hot backup (#22 item 5): `duetBackup` over the wire while a write stream
runs, `duet restore`, and a server started on the restored directory holds
exactly each database's state at the csn the backup reports."""

import subprocess
import threading

import pytest
from pymongo.errors import OperationFailure

from conftest import DUET, DuetServer


def test_backup_under_a_write_stream_restores_a_consistent_state(server, client, db, tmp_path):
    db.acc.insert_many([{"_id": "a", "last": -1}, {"_id": "b", "last": -1}])
    stop = threading.Event()
    written = [0]
    writer_client = server.client()

    def writer():
        live = writer_client[db.name]
        i = 0
        while not stop.is_set():
            live.log.insert_one({"_id": i})
            # One command sets both documents: a torn copy would differ.
            live.acc.update_many({}, {"$set": {"last": i}})
            i += 1
            written[0] = i

    t = threading.Thread(target=writer)
    t.start()
    try:
        while written[0] < 50:
            threading.Event().wait(0.01)
        to = tmp_path / "backup"
        reply = client.admin.command({"duetBackup": 1, "to": str(to)})
        at_backup = written[0]
        threading.Event().wait(0.1)
    finally:
        stop.set()
        t.join()
        writer_client.close()
    mine = [d for d in reply["databases"] if d["name"] == db.name]
    assert len(mine) == 1 and mine[0]["csn"] > 0
    live_count = db.log.count_documents({})
    assert live_count == written[0] > at_backup

    restored = tmp_path / "restored"
    out = subprocess.run([str(DUET), "restore", "--from", str(to), "--data-dir",
                          str(restored / "data")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"{db.name}: csn {mine[0]['csn']}" in out.stdout

    srv = DuetServer(restored)
    try:
        r = srv.client()[db.name]
        n = r.log.count_documents({})
        # A prefix of the stream with no gap, taken while writes went on.
        assert 50 <= n < live_count
        assert sorted(d["_id"] for d in r.log.find()) == list(range(n))
        lasts = {d["last"] for d in r.acc.find()}
        assert len(lasts) == 1 and lasts.pop() in (n - 1, n - 2)
        assert r.command("dbStats")["duet"]["csn"] == mine[0]["csn"]
    finally:
        assert srv.stop() == 0


def test_backup_refusals(client, db, tmp_path):
    db.c.insert_one({})
    with pytest.raises(OperationFailure) as e:
        db.command({"duetBackup": 1, "to": str(tmp_path / "x")})
    assert e.value.code == 13
    with pytest.raises(OperationFailure) as e:
        client.admin.command({"duetBackup": 1, "to": "relative/dir"})
    assert e.value.code == 2
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("keep")
    with pytest.raises(OperationFailure):
        client.admin.command({"duetBackup": 1, "to": str(full)})
    assert (full / "keep").read_text() == "keep"


def test_offline_backup_cli_refuses_a_locked_directory_and_restores(server, tmp_path):
    out = subprocess.run([str(DUET), "backup", "--data-dir", str(server.log_path.parent / "data"),
                          "--to", str(tmp_path / "b")], capture_output=True, text=True)
    assert out.returncode != 0 and "duetBackup" in out.stderr
    data = tmp_path / "offline"
    subprocess.run([str(DUET), "import", "--data-dir", str(data), "--db", "d", "--collection",
                    "c", "-"], input='{"_id": 1}\n{"_id": 2}\n', text=True, check=True,
                   capture_output=True)
    out = subprocess.run([str(DUET), "backup", "--data-dir", str(data), "--to",
                          str(tmp_path / "b")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "backup of 1 database(s)" in out.stdout
    out = subprocess.run([str(DUET), "restore", "--from", str(tmp_path / "b"), "--data-dir",
                          str(tmp_path / "r")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([str(DUET), "find", "--data-dir", str(tmp_path / "r"), "--db", "d",
                          "--collection", "c"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("_id") == 2
