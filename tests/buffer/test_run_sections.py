"""A run config's buffer sections are what the buffer keeps: every key set in YAML arrives, none is dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trinity.clients import BufferClient
from trinity.config import StreamConfig, TaskSetConfig, parse_run_config
from trinity.config.spec import from_spec


@pytest.fixture
def client(buffer_service):
    with BufferClient(buffer_service.address) as c:
        yield c


def _run_buffer(tmp_path: Path, unique: str):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"q": "1+1?", "a": "2"}) + "\n")
    yaml = f"""
model: {{path: smollm2}}
buffer:
  taskset: {{name: {unique}, path: {tasks}, prompt_key: q, answer_key: a, selector: shuffle, seed: 3,
             lease_seconds: 42, reward_fn: accuracy, limit: 1, epochs: 2}}
  experience_stream: {{name: {unique}, group: learners, max_deliveries: 3, claim_idle_ms: 1234,
                       dedupe_ttl_seconds: 60, max_len: 100, priority_replay: {{enabled: true, decay: 0.5}},
                       operators: [{{name: reward_filter, params: {{min_reward: 0.5}}}}]}}
"""
    return parse_run_config(yaml).buffer


def test_a_run_task_set_section_is_the_task_set_the_buffer_keeps(client, unique, tmp_path):
    section = _run_buffer(tmp_path, unique).taskset
    assert section is not None
    client.create_taskset(section)
    assert from_spec(TaskSetConfig, client.taskset(unique).spec, "spec") == section


def test_a_run_stream_section_is_the_stream_the_buffer_keeps(client, unique, tmp_path):
    section = _run_buffer(tmp_path, unique).experience_stream
    client.create_stream(section)
    assert from_spec(StreamConfig, client.stream(unique).spec, "spec") == section
