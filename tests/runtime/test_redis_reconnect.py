"""The services' Redis client rides out a Redis restart: no service process is restarted for it."""

from __future__ import annotations

import os
import signal

import grpc

from tests.buffer.helpers import experience
from trinity.cli.launcher import LocalStack, RestartPolicy
from trinity.v1 import buffer_pb2
from trinity.v1.buffer_pb2_grpc import BufferServiceStub


def test_the_buffer_keeps_answering_through_a_redis_sigkill_and_restart(tmp_path, unique):
    stack = LocalStack.up(tmp_path, roles=("gateway", "buffer"), policy=RestartPolicy(backoff=0.2))
    try:
        # No client-side retries: whatever is retried, the buffer retries against Redis itself.
        with grpc.insecure_channel(stack.services["buffer"].address, options=[("grpc.enable_retries", 0)]) as channel:
            buffer = BufferServiceStub(channel)
            buffer.CreateStream(buffer_pb2.CreateStreamRequest(spec=buffer_pb2.StreamSpec(name=unique)), timeout=10)

            def put(experience_id: str) -> None:
                request = buffer_pb2.PutExperiencesRequest(stream=unique, experiences=[experience(id=experience_id)])
                buffer.PutExperiences(request, timeout=30)

            put("before")
            assert stack.redis is not None and stack.redis.process is not None
            os.kill(stack.redis.process.pid, signal.SIGKILL)  # the supervisor brings it back after 0.2 s
            put("during")
            read = buffer_pb2.ReadExperiencesRequest(stream=unique, consumer="c", batch_size=10)
            reply = buffer.ReadExperiences(read, timeout=30)
        assert sorted(item.experience.id for item in reply.items) == ["before", "during"]
        assert stack.restarts == {"redis": 1, "gateway": 0, "buffer": 0}
    finally:
        stack.down()
