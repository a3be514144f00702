"""Expert demonstrations mixed into RL batches (mix, mix_chord in mode `both`).

The run's `buffer.offline_data` is loaded once into a stream of its own (`expert`, beside the experience
stream), as SFT-kind experiences, which the trainer's objective treats as expert rows. Every train batch
takes its usual rollouts (`train_batch_size`) from the experience stream and
`round(usual * ratio / (1 - ratio))` demonstrations from this one, so that `algorithm.expert_data_ratio`
is the demonstrations' share of the whole batch (Trinity-RFT's `expert_data_ratio`) and the trainer
consumes rollouts as fast as the explorers make them.

Demonstrations go through the consumer group like rollouts: acknowledged once trained, returned on a
stop, each trained once. A replacement trainer finds the stream already loaded (its `put` counter) and
does not load it again. When they run out, batches are rollouts only (`expert_samples` says how many).
"""

from __future__ import annotations

from trinity.clients import BufferClient
from trinity.config import RunConfig, StreamConfig, naming
from trinity.config.modes import RunMode
from trinity.v1 import common_pb2

EXPERT_STREAM = "expert"


def uses_expert_data(config: RunConfig) -> bool:
    """Whether the run mixes demonstrations into its RL batches: an exploring run whose preset trains
    expert rows, with offline data to take them from."""
    import trinity.algorithms as alg

    preset = alg.preset(config.algorithm.algorithm_type)
    return config.mode == RunMode.BOTH and config.buffer.offline_data is not None and preset.uses_expert_data


def expert_count(usual: int, ratio: float) -> int:
    """Demonstrations beside `usual` rollouts so that they are `ratio` of the batch."""
    return round(usual * ratio / (1.0 - ratio))


class ExpertStream:
    """The run's demonstrations, read `per_batch` at a time by one trainer instance."""

    def __init__(self, buffer: BufferClient, config: RunConfig, run_id: str, stage: int, consumer: str) -> None:
        self.buffer = buffer
        self.config = config
        self.consumer = consumer
        self.name = naming.experience_stream(run_id, stage, EXPERT_STREAM)
        self.per_batch = expert_count(config.train_batch_size, config.algorithm.expert_data_ratio)

    def open(self) -> int:
        """Create and load the stream unless a predecessor did; take back what this consumer held. Returns
        the demonstrations loaded now (0 when already loaded)."""
        offline = self.config.buffer.offline_data
        assert offline is not None
        info = self.buffer.create_stream(StreamConfig(name=self.name), exist_ok=True)
        loaded = 0
        if info.stats.put == 0:
            reply = self.buffer.load_offline(self.name, offline, common_pb2.EXPERIENCE_KIND_SFT)
            if reply.loaded == 0:
                raise ValueError(f"buffer.offline_data: {offline.path!r} holds no demonstrations to mix in")
            loaded = int(reply.loaded)
        self.buffer.nack(self.name, self.consumer, all_pending=True)
        return loaded

    def read(self) -> tuple[list[str], list[common_pb2.Experience]]:
        """Up to `per_batch` demonstrations; fewer (none) once they run out. Never waits: they are all
        in the stream from the start."""
        if self.per_batch == 0:
            return [], []
        got = self.buffer.read(self.name, self.consumer, self.per_batch)
        return list(got.entry_ids), list(got.experiences)
