"""Runs as the page shows them: gateway messages (through the SDK) and buffer replies turned into JSON."""

from __future__ import annotations

import json
from typing import Any

import yaml

from trinity.clients import BufferClient
from trinity.config import RunConfig, naming
from trinity.config.modes import EXPLORER_MODES
from trinity.runtime.events import kind_name
from trinity.sdk import TrinityClient
from trinity.v1 import buffer_pb2, common_pb2, gateway_pb2

ROLE_BUFFER = "buffer"
ROLE_EXPLORER = "explorer"
PENDING, PAUSED = gateway_pb2.RUN_STATE_PENDING, gateway_pb2.RUN_STATE_PAUSED


def state_name(state: int) -> str:
    return gateway_pb2.RunState.Name(state).removeprefix("RUN_STATE_") if state else ""


def stage_config(run: gateway_pb2.Run) -> RunConfig:
    """The config of the run's current stage (as the gateway hands it to the services)."""
    return RunConfig.model_validate_json(run.config_json).stage_configs()[run.stage]


def summary(run: gateway_pb2.Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "mode": json.loads(run.config_json).get("mode", "") if run.config_json else "",
        "state": state_name(run.state),
        "train_step": run.train_step,
        "explore_step": run.explore_step,
        "model_version": run.model_version,
        "created_unix_ms": run.created_unix_ms,
        "updated_unix_ms": run.updated_unix_ms,
        "error": run.error,
        # A paused run's services stop one by one (the trainer after a checkpoint): it resumes once none is left.
        "pausing": run.state == PAUSED and bool(run.assignments),
        "tenant": run.tenant,
        "priority": run.priority,
        "queued_unix_ms": queued_unix_ms(run),
    }


def queued_unix_ms(run: gateway_pb2.Run) -> int:
    """When the run joined the queue; runs recorded before the gateway kept it were queued when created."""
    return run.queued_unix_ms or run.created_unix_ms


def queue(found: list[gateway_pb2.Run]) -> list[gateway_pb2.Run]:
    """The pending runs in the order the gateway starts them: higher priority first, then first queued (then by id,
    as the gateway breaks ties)."""
    pending = [r for r in found if r.state == PENDING]
    return sorted(pending, key=lambda r: (-r.priority, queued_unix_ms(r), r.id))


def explorers(run: gateway_pb2.Run) -> dict[str, Any]:
    """How many explorers the current stage wants (ScaleRun's count, else its config's) and the instances it has:
    `active` serve it, `leaving` were asked to go (scaled down) and finish their batch first."""
    config = stage_config(run)
    wanted = run.explorers or (config.explorer.num_workers if config.mode in EXPLORER_MODES else 0)
    assigned = sorted(i for i, role in run.assignments.items() if role == ROLE_EXPLORER)
    return {
        "wanted": wanted,
        "active": [i for i in assigned if i not in run.leaving],
        "leaving": [i for i in assigned if i in run.leaving],
    }


def with_config(run: gateway_pb2.Run) -> dict[str, Any]:
    """The summary, the validated config as YAML, the latest value of each metric and the run's explorers."""
    config = json.loads(run.config_json) if run.config_json else {}
    return {
        **summary(run),
        "config_yaml": yaml.safe_dump(config, sort_keys=False),
        "latest_metrics": dict(run.latest_metrics),
        "explorers": explorers(run),
    }


def services(run: gateway_pb2.Run, instances: list[gateway_pb2.Instance]) -> list[dict[str, Any]]:
    """The instances assigned to the run, and the buffer(s), with their liveness."""
    out = []
    for instance in instances:
        role = run.assignments.get(instance.instance_id) or (ROLE_BUFFER if instance.service == "buffer" else "")
        if role:
            out.append(
                {
                    "instance_id": instance.instance_id,
                    "service": instance.service,
                    "address": instance.address,
                    "alive": instance.alive,
                    "role": role,
                }
            )
    return out


def experience_stream(run: gateway_pb2.Run) -> str:
    return naming.experience_stream(run.id, run.stage, stage_config(run).buffer.experience_stream.name)


def accounting(stats: buffer_pb2.StreamStats | None) -> dict[str, Any]:
    """What came into the run's stream, went to the trainer, was trained on, and was dropped (by reason)."""
    if stats is None:
        return {"put": 0, "delivered": 0, "acked": 0, "pending": 0, "dropped": {}}
    return {
        "put": stats.put,
        "delivered": stats.delivered,
        "acked": stats.acked,
        "pending": stats.pending,
        "dropped": dict(stats.dropped),
    }


def event_json(event: gateway_pb2.RunEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": kind_name(event.kind),
        "source": event.source,
        "step": event.step,
        "model_version": event.model_version,
        "metrics": dict(event.metrics),
        "message": event.message,
        "unix_ms": event.unix_ms,
        "state": state_name(event.state),
    }


def experience_json(entry_id: str, e: common_pb2.Experience) -> dict[str, Any]:
    prompt = e.prompt_text or "\n".join(f"{m.role}: {m.content}" for m in e.messages)
    return {
        "id": e.id or entry_id,
        "prompt": prompt,
        "response": e.response_text,
        "reward": e.reward,
        "components": dict(e.reward_components),
        "model_version": e.model_version,
        "advantage": e.metrics.get("advantage"),
        "group_id": e.group_id,
        "finish_reason": e.finish_reason,
    }


def buffer_address(client: TrinityClient) -> str | None:
    """The live buffer the gateway knows (the console reaches the buffer through its registry entry)."""
    buffers = [i for i in client.instances("buffer") if i.alive]
    return buffers[0].address if buffers else None


def stream_stats(buffer: BufferClient, stream: str) -> buffer_pb2.StreamStats | None:
    import grpc

    try:
        return buffer.stream(stream).stats
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:  # the run has not prepared its stream yet
            return None
        raise
