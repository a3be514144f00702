"""Every path a client names resolves inside the buffer's data roots (TRINITY_DATA_ROOTS), symlinks followed.

The buffer here has one root; a sibling folder outside it holds a "secret" task file that no request may read
and a file no export may touch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.buffer.helpers import experience
from tests.conftest import ServiceProcess
from trinity.clients import BufferClient
from trinity.config import OfflineDataConfig, StreamConfig, TaskSetConfig
from trinity.runtime.client import open_channel
from trinity.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2

ROWS = [{"prompt": "1+1?", "answer": "2", "api_key": "sk-planted"}]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(root, outside): the buffer's only data root and a folder beside it."""
    base = tmp_path_factory.mktemp("confinement")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    _write_rows(outside / "secret.jsonl")
    (outside / "keep.txt").write_text("untouched")
    return root, outside


@pytest.fixture(scope="module")
def confined_buffer(redis_server, places) -> Iterator[ServiceProcess]:
    root, _ = places
    env = {"TRINITY_REDIS_URL": redis_server.url, "TRINITY_DATA_ROOTS": str(root), "TRINITY_RUNS_DIR": ""}
    service = ServiceProcess("buffer", env=env).start()
    yield service
    service.stop()


@pytest.fixture
def client(confined_buffer) -> Iterator[BufferClient]:
    with BufferClient(confined_buffer.address) as c:
        yield c


@pytest.fixture
def stub(confined_buffer) -> Iterator[buffer_pb2_grpc.BufferServiceStub]:
    with open_channel(confined_buffer.address) as channel:
        yield buffer_pb2_grpc.BufferServiceStub(channel)


def _write_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _taskset(client: BufferClient, name: str, path: str | Path) -> grpc.RpcError:
    return _refusal(lambda: client.create_taskset(TaskSetConfig(name=name, path=str(path))))


def _stream_with_entries(client: BufferClient, name: str) -> None:
    client.create_stream(StreamConfig(name=name))
    client.put(name, [experience(), experience()])


def test_a_task_file_inside_a_root_is_read(client, places, unique):
    root, _ = places
    info = client.create_taskset(TaskSetConfig(name=unique, path=str(_write_rows(root / f"{unique}.jsonl"))))
    assert info.size == 1


def test_a_path_that_climbs_out_of_the_root_with_dotdot_is_denied(client, places, unique):
    root, _ = places
    err = _taskset(client, unique, f"{root}/../outside/secret.jsonl")
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spec.path" in err.details() and "sk-planted" not in err.details()


def test_an_absolute_path_outside_every_root_is_denied(client, places, unique):
    _, outside = places
    assert _taskset(client, unique, outside / "secret.jsonl").code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_relative_path_resolves_from_the_buffers_working_directory_not_the_root(client, unique):
    assert _taskset(client, unique, "secret.jsonl").code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_symlink_inside_the_root_that_points_outside_is_denied(client, places, unique):
    root, outside = places
    link = root / f"{unique}-link.jsonl"
    link.symlink_to(outside / "secret.jsonl")
    assert _taskset(client, unique, link).code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_symlinked_folder_inside_the_root_that_points_outside_is_denied(client, places, unique):
    root, outside = places
    (root / unique).symlink_to(outside, target_is_directory=True)
    assert _taskset(client, unique, root / unique / "secret.jsonl").code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_symlink_that_stays_inside_the_root_is_followed(client, places, unique):
    root, _ = places
    link = root / f"{unique}-link.jsonl"
    link.symlink_to(_write_rows(root / f"{unique}.jsonl"))
    assert client.create_taskset(TaskSetConfig(name=unique, path=str(link))).size == 1


def test_a_datasets_folder_holding_a_symlink_out_is_denied(client, places, unique):
    root, outside = places
    folder = root / unique
    folder.mkdir()
    (folder / "train.jsonl").symlink_to(outside / "secret.jsonl")
    assert _taskset(client, unique, folder).code() == grpc.StatusCode.PERMISSION_DENIED


def test_outside_the_roots_a_missing_path_and_an_existing_one_get_the_same_answer(client, places, unique):
    _, outside = places
    existing = _taskset(client, unique, outside / "secret.jsonl")
    missing = _taskset(client, unique, outside / "absent.jsonl")
    assert existing.code() == missing.code() == grpc.StatusCode.PERMISSION_DENIED
    assert existing.details().replace("secret", "absent") == missing.details()


def test_a_missing_path_inside_a_root_is_not_found_showing_only_the_path_as_given(client, places, unique):
    root, _ = places
    (root / f"{unique}-dir").symlink_to(root, target_is_directory=True)
    given = f"{root}/{unique}-dir/absent.jsonl"
    err = _taskset(client, unique, given)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert repr(given) in err.details() and f"{root}/absent.jsonl" not in err.details()


def test_offline_data_outside_the_roots_is_denied(client, places, unique):
    _, outside = places
    client.create_stream(StreamConfig(name=unique))
    config = OfflineDataConfig(path=str(outside / "secret.jsonl"), response_key="answer")
    err = _refusal(lambda: client.load_offline(unique, config, common_pb2.EXPERIENCE_KIND_SFT))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


def test_an_export_outside_the_roots_is_denied_and_writes_nothing(client, places, unique):
    _, outside = places
    _stream_with_entries(client, unique)
    err = _refusal(lambda: client.export(unique, str(outside / f"{unique}.jsonl")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert not (outside / f"{unique}.jsonl").exists()


def test_an_export_through_a_symlink_pointing_outside_is_denied_and_leaves_the_target(client, places, unique):
    root, outside = places
    _stream_with_entries(client, unique)
    (root / f"{unique}.jsonl").symlink_to(outside / "keep.txt")
    err = _refusal(lambda: client.export(unique, str(root / f"{unique}.jsonl")))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (outside / "keep.txt").read_text() == "untouched"


def test_an_export_does_not_replace_an_existing_file(client, places, unique):
    root, _ = places
    _stream_with_entries(client, unique)
    target = root / f"{unique}.jsonl"
    target.write_text("earlier export\n")
    err = _refusal(lambda: client.export(unique, str(target)))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "overwrite" in err.details()
    assert target.read_text() == "earlier export\n"


def test_an_export_with_overwrite_replaces_the_file(client, stub, places, unique):
    root, _ = places
    _stream_with_entries(client, unique)
    target = root / f"{unique}.jsonl"
    target.write_text("earlier export\n")
    reply = stub.ExportStream(buffer_pb2.ExportStreamRequest(stream=unique, path=str(target), overwrite=True))
    assert reply.exported == 2
    assert len([json.loads(line)["entry_id"] for line in target.read_text().splitlines()]) == 2


def test_a_new_export_inside_a_root_is_written(client, places, unique):
    root, _ = places
    _stream_with_entries(client, unique)
    assert client.export(unique, str(root / f"{unique}.sqlite")) == 2
