"""A read-only look at a stream's newest experiences, filtered (SampleExperiences): for people inspecting a run.

It walks the stream newest first (XREVRANGE) and never touches the consumer group, so the trainer's deliveries,
acknowledgements and counters are exactly what they would have been without it. The walk is bounded
(`MAX_SCANNED` entries), so a filter nothing matches costs one bounded scan, not the whole stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trinity.buffer.streams.experience_stream import ExperienceStream
from trinity.v1 import buffer_pb2, common_pb2

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_SCANNED = 10_000


@dataclass(frozen=True)
class SampleFilter:
    min_reward: float = -math.inf
    max_reward: float = math.inf
    model_version: int | None = None

    @classmethod
    def of(cls, request: buffer_pb2.SampleExperiencesRequest) -> SampleFilter:
        return cls(
            min_reward=request.min_reward if request.HasField("min_reward") else -math.inf,
            max_reward=request.max_reward if request.HasField("max_reward") else math.inf,
            model_version=request.model_version if request.HasField("model_version") else None,
        )

    def keeps(self, experience: common_pb2.Experience) -> bool:
        if self.model_version is not None and experience.model_version != self.model_version:
            return False
        return self.min_reward <= experience.reward <= self.max_reward


def sample(stream: ExperienceStream, limit: int, keep: SampleFilter) -> buffer_pb2.SampleExperiencesResponse:
    """Up to `limit` of the newest entries `keep` keeps, newest first."""
    reply = buffer_pb2.SampleExperiencesResponse()
    for entry_id, payload in stream.newest():
        reply.scanned += 1
        experience = common_pb2.Experience.FromString(payload)
        if keep.keeps(experience):
            reply.items.add(entry_id=entry_id, experience=experience)
            if len(reply.items) >= limit:
                break
        if reply.scanned >= MAX_SCANNED:
            break
    return reply
