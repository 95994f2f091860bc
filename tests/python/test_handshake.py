"""Handshake: hello / isMaster / ismaster over OP_MSG and legacy OP_QUERY, with exact BSON types."""

import bson

import wire

INT32, INT64, DOUBLE, BOOL, DATETIME = 0x10, 0x12, 0x01, 0x08, 0x09


def test_hello_fields_and_exact_types(server):
    s = wire.connect(server.port)
    s.sendall(wire.op_msg({"hello": 1, "$db": "admin"}))
    op, body = wire.read_reply(s)
    assert op == wire.OP_MSG
    raw = wire.msg_reply_doc(body)
    types = wire.element_types(raw)
    doc = bson.decode(raw)
    assert doc["isWritablePrimary"] is True and doc["helloOk"] is True
    assert doc["maxBsonObjectSize"] == 16777216 and types["maxBsonObjectSize"] == INT32
    assert doc["maxMessageSizeBytes"] == 48000000 and types["maxMessageSizeBytes"] == INT32
    assert doc["maxWriteBatchSize"] == 100000 and types["maxWriteBatchSize"] == INT32
    assert doc["minWireVersion"] == 0 and types["minWireVersion"] == INT32
    assert doc["maxWireVersion"] >= 21 and types["maxWireVersion"] == INT32
    assert doc["logicalSessionTimeoutMinutes"] == 30 and types["logicalSessionTimeoutMinutes"] == INT32
    assert types["localTime"] == DATETIME and types["connectionId"] == INT32
    assert types["ok"] == DOUBLE and doc["ok"] == 1.0
    assert "compression" not in doc
    s.close()


def test_ismaster_aliases(client):
    for name in ("isMaster", "ismaster"):
        doc = client.admin.command(name)
        assert doc["ismaster"] is True
        assert doc["maxWireVersion"] >= 21


def test_legacy_op_query_handshake(server):
    s = wire.connect(server.port)
    s.sendall(wire.op_query("admin.$cmd", {"isMaster": 1, "client": {"driver": {"name": "test"}}}))
    op, body = wire.read_reply(s)
    assert op == wire.OP_REPLY
    number_returned = int.from_bytes(body[16:20], "little")
    assert number_returned == 1
    doc = bson.decode(body[20:])
    assert doc["ismaster"] is True and doc["ok"] == 1.0
    # Wrapped form, on another database's $cmd.
    s.sendall(wire.op_query("test.$cmd", {"$query": {"ping": 1}, "$readPreference": {"mode": "primary"}}))
    op, body = wire.read_reply(s)
    assert op == wire.OP_REPLY and bson.decode(body[20:])["ok"] == 1.0
    # A legacy query on a collection gets a QueryFailure reply.
    s.sendall(wire.op_query("test.coll", {}))
    op, body = wire.read_reply(s)
    flags = int.from_bytes(body[0:4], "little")
    assert op == wire.OP_REPLY and flags & 2
    assert "$err" in bson.decode(body[20:])
    s.close()


def test_op_msg_sequences_checksum_and_more_to_come(server, client):
    s = wire.connect(server.port)
    db = "t_wire_seq"
    client.drop_database(db)
    r = wire.command(s, {"insert": "c", "$db": db}, sequences=[("documents", [{"_id": 1}, {"_id": 2}])])
    assert r["n"] == 2
    # Checksum present and correct.
    import struct
    import zlib  # noqa: F401  (crc32c is computed below without extra packages)

    def crc32c(data, crc=0):
        crc ^= 0xFFFFFFFF
        for b in data:
            crc ^= b
            for _ in range(8):
                crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        return crc ^ 0xFFFFFFFF

    body = struct.pack("<I", 1) + b"\x00" + bson.encode({"ping": 1, "$db": "admin"})
    msg = struct.pack("<iiii", 16 + len(body) + 4, 9, 0, wire.OP_MSG) + body
    s.sendall(msg + struct.pack("<I", crc32c(msg)))
    op, reply = wire.read_reply(s)
    assert bson.decode(wire.msg_reply_doc(reply))["ok"] == 1.0
    # Wrong checksum: an error reply, the connection stays usable.
    s.sendall(msg + struct.pack("<I", crc32c(msg) ^ 1))
    op, reply = wire.read_reply(s)
    err = bson.decode(wire.msg_reply_doc(reply))
    assert err["ok"] == 0.0 and "checksum" in err["errmsg"]
    # moreToCome: no reply; the write happens.
    s.sendall(wire.op_msg({"insert": "c", "documents": [{"_id": 3}], "$db": db}, flags=2))
    r = wire.command(s, {"count": "c", "$db": db})
    assert r["n"] == 3
    s.close()
    client.drop_database(db)
