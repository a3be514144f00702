"""The ranks of a data-parallel trainer: rank 0 is the trainer service (`leader`), ranks 1..N-1 follow it.

`build_run_backend` gives the runner a `ReplicatedBackend` when a torch run has `data_parallel_size > 1`;
the followers are `trinity-trainer-rank` processes, started by the leader on its host or by torchrun /
Kubernetes on others (`follower`). See docs/trainer.md, "Ranks".
"""

from trinity.trainer.ranks.leader import RankFailure, ReplicatedBackend, build_run_backend

__all__ = ["RankFailure", "ReplicatedBackend", "build_run_backend"]
