"""Hostile input over raw sockets: each case gets an error reply or a closed
connection, the server stays up, other connections and stored data are untouched."""

import socket
import struct
import time

import bson
import pytest

import wire


@pytest.fixture
def canary(client):
    """Data and a live connection that must survive every hostile case."""
    client.drop_database("t_canary")
    client.t_canary.c.insert_many([{"_id": i} for i in range(100)])
    yield client
    assert client.t_canary.c.count_documents({}) == 100
    assert client.admin.command("ping")["ok"] == 1.0
    client.drop_database("t_canary")


def raw_header(length, op=wire.OP_MSG):
    return struct.pack("<iiii", length, 1, 0, op)


@pytest.mark.parametrize("length", [0, 15, -1, 48_000_001, 2**31 - 1])
def test_bad_message_length_closes(server, canary, length):
    s = wire.connect(server.port)
    s.sendall(raw_header(length))
    assert wire.is_closed(s)


def test_unknown_and_compressed_opcodes_close(server, canary):
    for op in (9999, 2012, 2001):
        s = wire.connect(server.port)
        s.sendall(wire.frame(op, b"\x00" * 20))
        assert wire.is_closed(s)
    assert "unsupported opcode" in server.log_text()


def test_garbage_and_truncated_frames(server, canary):
    s = wire.connect(server.port)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wire.is_closed(s)
    s = wire.connect(server.port)
    msg = wire.op_msg({"ping": 1, "$db": "admin"})
    s.sendall(msg[:-5])
    s.shutdown(socket.SHUT_WR)
    assert wire.is_closed(s)


def test_invalid_bson_gets_an_error_reply(server, canary):
    s = wire.connect(server.port)
    body = struct.pack("<I", 0) + b"\x00" + struct.pack("<i", 12) + b"\x02a\x00\xff\xff\xff\x7f\x00"
    s.sendall(wire.frame(wire.OP_MSG, body))
    op, reply = wire.read_reply(s)
    err = bson.decode(wire.msg_reply_doc(reply))
    assert err["ok"] == 0.0 and err["code"] == 22
    # Bad section kind, missing body, document overrunning its section.
    for body in (struct.pack("<I", 0) + b"\x07",
                 struct.pack("<I", 0),
                 struct.pack("<I", 0) + b"\x00" + struct.pack("<i", 500) + b"\x00"):
        s.sendall(wire.frame(wire.OP_MSG, body))
        op, reply = wire.read_reply(s)
        assert bson.decode(wire.msg_reply_doc(reply))["ok"] == 0.0
    # The same connection still works.
    assert wire.command(s, {"ping": 1, "$db": "admin"})["ok"] == 1.0


def test_missing_db_and_unknown_required_flag(server, canary):
    s = wire.connect(server.port)
    assert wire.command(s, {"ping": 1})["code"] == 40571
    assert wire.command(s, {"ping": 1, "$db": "admin"}, flags=1 << 5)["ok"] == 0.0


def test_nesting_too_deep_is_refused_without_crashing(server, canary):
    # Build 100,000 levels of nesting by hand (a recursive encoder would choke).
    depth = 100_000
    inner = b"\x05\x00\x00\x00\x00"
    parts = []
    for _ in range(depth):
        parts.append(b"\x03a\x00")
    # Lengths: each wrapper is 4 + 3 + child + 1 bytes.
    sizes = []
    size = len(inner)
    for _ in range(depth):
        size = 4 + 3 + size + 1
        sizes.append(size)
    out = bytearray()
    for i in range(depth):
        out += struct.pack("<i", sizes[depth - 1 - i]) + b"\x03a\x00"
    out += inner
    out += b"\x00" * depth
    doc = bytes(out)
    # Wrap as the value of field "filter" in a find command.
    head = bson.encode({"find": "c", "$db": "t_canary"})[:-1]
    cmd_body = head[4:] + b"\x03filter\x00" + doc + b"\x00"
    cmd = struct.pack("<i", 4 + len(cmd_body)) + cmd_body
    s = wire.connect(server.port)
    s.sendall(wire.frame(wire.OP_MSG, struct.pack("<I", 0) + b"\x00" + cmd))
    op, reply = wire.read_reply(s)
    err = bson.decode(wire.msg_reply_doc(reply))
    assert err["ok"] == 0.0 and err["code"] == 15


def test_stalled_half_message_times_out(server, canary):
    # The session server runs with --message-timeout-secs 1.5.
    s = wire.connect(server.port)
    s.sendall(raw_header(100)[:10])
    t0 = time.time()
    assert wire.is_closed(s, timeout=10)
    assert time.time() - t0 < 8
    s = wire.connect(server.port)
    s.sendall(raw_header(1000) + b"\x00" * 10)
    assert wire.is_closed(s, timeout=10)


def test_large_claim_small_send_does_not_allocate(server, canary):
    socks = []
    for _ in range(20):
        s = wire.connect(server.port)
        s.sendall(raw_header(47_000_000) + b"\x00" * 100)
        socks.append(s)
    for s in socks:
        assert wire.is_closed(s, timeout=10)


def test_document_too_large_is_an_error(server, client):
    client.drop_database("t_big")
    big = {"_id": 1, "s": "x" * (16 * 1024 * 1024)}
    s = wire.connect(server.port)
    r = wire.command(s, {"insert": "c", "$db": "t_big"}, sequences=[("documents", [big])])
    assert r["ok"] == 0.0 or r.get("writeErrors")
    assert client.t_big.c.count_documents({}) == 0
    client.drop_database("t_big")
