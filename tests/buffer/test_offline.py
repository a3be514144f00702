"""Offline data into streams (SFT, DPO) and streams out to JSONL / SQLite."""

from __future__ import annotations

import json
import sqlite3

import grpc
import pytest

from tests.buffer.helpers import experience
from trinity.clients import BufferClient
from trinity.config import OfflineDataConfig, StreamConfig
from trinity.v1 import common_pb2


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_sft_chats_and_prompt_response_pairs_load_as_sft_experiences(client, unique, tmp_path):
    client.create_stream(StreamConfig(name=unique))
    chats = _write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {"conversation": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
            {"conversation": []},  # nothing to learn from: skipped, and counted
        ],
    )
    pairs = _write_jsonl(tmp_path / "pairs.jsonl", [{"q": "1+1?", "a": "2"}])
    sft = common_pb2.EXPERIENCE_KIND_SFT
    reply = client.load_offline(unique, OfflineDataConfig(path=chats, messages_key="conversation"), sft)
    assert (reply.loaded, reply.skipped) == (1, 1)
    reply = client.load_offline(unique, OfflineDataConfig(path=pairs, prompt_key="q", response_key="a"), sft)
    assert reply.loaded == 1
    again = client.load_offline(unique, OfflineDataConfig(path=pairs, prompt_key="q", response_key="a"), sft)
    assert again.loaded == 0  # same content, same id: loading twice adds nothing
    got = client.read(unique, "t", 10).experiences
    assert [e.kind for e in got] == [sft, sft]
    assert [m.content for m in got[0].messages] == ["2+2?", "4"]
    assert (got[1].prompt_text, got[1].response_text) == ("1+1?", "2")


def test_preference_pairs_load_with_chosen_as_response(client, unique, tmp_path):
    client.create_stream(StreamConfig(name=unique))
    path = _write_jsonl(
        tmp_path / "dpo.jsonl",
        [{"prompt": "Say hi", "chosen": [{"role": "assistant", "content": "Hi!"}], "rejected": "Go away"}],
    )
    kind = common_pb2.EXPERIENCE_KIND_PREFERENCE
    assert client.load_offline(unique, OfflineDataConfig(path=path), kind).loaded == 1
    (pair,) = client.read(unique, "t", 10).experiences
    assert (pair.prompt_text, pair.response_text, pair.preference.rejected_text) == ("Say hi", "Hi!", "Go away")


def test_offline_load_without_a_kind_is_invalid(client, unique, tmp_path):
    client.create_stream(StreamConfig(name=unique))
    path = _write_jsonl(tmp_path / "x.jsonl", [{"prompt": "p", "response": "r"}])
    with pytest.raises(grpc.RpcError) as info:
        client.load_offline(unique, OfflineDataConfig(path=path), common_pb2.EXPERIENCE_KIND_UNSPECIFIED)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "kind" in info.value.details()


def test_export_to_jsonl_and_sqlite_writes_every_entry(client, unique, tmp_path):
    client.create_stream(StreamConfig(name=unique))
    sent = [experience(id=f"e{i}", reward=i / 2, model_version=i) for i in range(3)]
    client.put(unique, sent)
    jsonl = tmp_path / "out.jsonl"
    assert client.export(unique, str(jsonl)) == 3
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["id"] for r in records] == ["e0", "e1", "e2"]
    assert records[2]["reward"] == 1.0 and records[2]["response_token_ids"] == [0, 1, 2, 3]
    db = tmp_path / "out.sqlite"
    assert client.export(unique, str(db)) == 3
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT id, model_version, reward FROM experiences ORDER BY id").fetchall()
    assert rows == [("e0", 0, 0.0), ("e1", 1, 0.5), ("e2", 2, 1.0)]
