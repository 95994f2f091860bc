"""Wire compression (OP_COMPRESSED, opcode 2012): pymongo with `compressors=`
snappy / zstd / zlib, negotiation in `hello`, replies compressed as their
requests were, and hostile compressed messages closing only their own
connection."""

import struct
import zlib

import bson
import pytest
import snappy
import zstandard

import wire

OP_COMPRESSED = 2012
IDS = {"noop": 0, "snappy": 1, "zlib": 2, "zstd": 3}


def pack(name, data):
    if name == "snappy":
        return snappy.compress(data)
    if name == "zlib":
        return zlib.compress(data)
    if name == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def unpack(cid, data):
    if cid == 1:
        return snappy.uncompress(data)
    if cid == 2:
        return zlib.decompress(data)
    if cid == 3:
        return zstandard.ZstdDecompressor().decompress(data)
    return data


def compressed(msg, name, declared=None, cid=None):
    """Wrap a whole message (header included) in OP_COMPRESSED."""
    _len, rid, rto, op = struct.unpack_from("<iiii", msg)
    body = msg[16:]
    declared = len(body) if declared is None else declared
    cid = IDS[name] if cid is None else cid
    payload = struct.pack("<iiB", op, declared, cid) + pack(name, body)
    return struct.pack("<iiii", 16 + len(payload), rid, rto, OP_COMPRESSED) + payload


def roundtrip(s, msg):
    """Send `msg`; the reply's opcode, compressor id (None: not compressed)
    and the decoded OP_MSG reply document."""
    s.sendall(msg)
    op, body = wire.read_reply(s)
    cid = None
    if op == OP_COMPRESSED:
        op, size, cid = struct.unpack_from("<iiB", body)
        body = unpack(cid, body[9:])
        assert len(body) == size
    assert op == wire.OP_MSG
    return cid, bson.decode(wire.msg_reply_doc(body))


# pymongo warns and goes on uncompressed when a compressor's module is
# missing: that must fail here, not pass silently.
@pytest.mark.filterwarnings("error::UserWarning")
@pytest.mark.parametrize("name", ["snappy", "zstd", "zlib"])
def test_pymongo_with_each_compressor(server, name):
    client = server.client(compressors=name)
    try:
        coll = client[f"t_compress_{name}"].c
        coll.drop()
        docs = [{"_id": i, "text": "word " * 200, "n": i} for i in range(300)]
        coll.insert_many(docs)
        assert coll.count_documents({}) == 300
        got = list(coll.find({}, sort=[("_id", 1)]))
        assert got == docs
        coll.update_one({"_id": 7}, {"$set": {"n": -1}})
        assert coll.find_one({"_id": 7})["n"] == -1
        total = list(coll.aggregate([{"$group": {"_id": None, "s": {"$sum": "$n"}}}]))
        assert total[0]["s"] == sum(range(300)) - 7 - 1
        client.drop_database(f"t_compress_{name}")
    finally:
        client.close()


def test_hello_negotiates_in_the_clients_order(server):
    s = wire.connect(server.port)
    doc = wire.command(s, {"hello": 1, "compression": ["zlib", "lz4", "snappy"], "$db": "admin"})
    assert doc["compression"] == ["zlib", "snappy"]
    doc = wire.command(s, {"hello": 1, "compression": ["lz4"], "$db": "admin"})
    assert "compression" not in doc
    doc = wire.command(s, {"hello": 1, "compression": "zlib", "$db": "admin"})
    assert doc["ok"] == 0 and doc["code"] == 2
    s.close()


@pytest.mark.parametrize("name", ["snappy", "zstd", "zlib"])
def test_reply_uses_the_requests_compressor(server, name):
    s = wire.connect(server.port)
    cid, doc = roundtrip(s, compressed(wire.op_msg({"ping": 1, "$db": "admin"}), name))
    assert cid == IDS[name] and doc["ok"] == 1.0
    # An uncompressed request on the same connection: an uncompressed reply.
    cid, doc = roundtrip(s, wire.op_msg({"ping": 1, "$db": "admin"}))
    assert cid is None and doc["ok"] == 1.0
    # hello is never compressed, even when its request was.
    cid, doc = roundtrip(s, compressed(wire.op_msg({"hello": 1, "$db": "admin"}), name))
    assert cid is None and doc["helloOk"] is True
    s.close()


def test_disabled_offers_nothing_and_refuses_compressed_messages(make_server):
    srv = make_server("--network-message-compressors", "disabled")
    s = wire.connect(srv.port)
    doc = wire.command(s, {"hello": 1, "compression": ["snappy", "zstd", "zlib"], "$db": "admin"})
    assert "compression" not in doc
    s.sendall(compressed(wire.op_msg({"ping": 1, "$db": "admin"}), "zlib"))
    assert wire.is_closed(s)
    assert "does not offer" in srv.log_text()
    # A driver asking for compression still works, uncompressed.
    client = srv.client(compressors="zlib")
    try:
        assert client.admin.command("ping")["ok"] == 1.0
    finally:
        client.close()


def test_only_the_listed_compressors_are_offered(make_server):
    srv = make_server("--network-message-compressors", "zlib")
    s = wire.connect(srv.port)
    doc = wire.command(s, {"hello": 1, "compression": ["snappy", "zlib"], "$db": "admin"})
    assert doc["compression"] == ["zlib"]
    s.sendall(compressed(wire.op_msg({"ping": 1, "$db": "admin"}), "snappy"))
    assert wire.is_closed(s)


def test_hostile_compressed_messages_close_the_connection(server, client):
    client.t_compress_canary.c.insert_many([{"_id": i} for i in range(10)])
    ping = wire.op_msg({"ping": 1, "$db": "admin"})
    body_len = len(ping) - 16
    bomb = zlib.compress(b"\x00" * 20_000_000)
    cases = [
        ("size past the message limit", compressed(ping, "zlib", declared=48_000_000)),
        ("negative size", compressed(ping, "zlib", declared=-1)),
        ("declared too small", compressed(ping, "zlib", declared=body_len - 1)),
        ("declared too large", compressed(ping, "zstd", declared=body_len + 1)),
        ("snappy size mismatch", compressed(ping, "snappy", declared=body_len + 3)),
        ("unknown compressor id", compressed(ping, "noop", cid=77)),
        ("noop not offered", compressed(ping, "noop")),
        ("garbage", compressed(ping, "noop", cid=2)),
        ("bomb", struct.pack("<iiii", 16 + 9 + len(bomb), 1, 0, OP_COMPRESSED)
         + struct.pack("<iiB", wire.OP_MSG, 4096, 2) + bomb),
        ("too short", struct.pack("<iiii", 20, 1, 0, OP_COMPRESSED) + b"\x00" * 4),
    ]
    for what, msg in cases:
        s = wire.connect(server.port)
        s.sendall(msg)
        assert wire.is_closed(s), what
    log = server.log_text()
    assert "unreadable OP_COMPRESSED message" in log
    assert "outside 0..=47999984" in log
    assert "unknown compressor id 77" in log
    assert "decompressed to more than" in log
    assert client.t_compress_canary.c.count_documents({}) == 10
    client.drop_database("t_compress_canary")
