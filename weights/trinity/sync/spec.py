"""What the Gateway negotiates for one sync group, and the trainer-side reservation of its rendezvous port.

Importable without torch (the Gateway only needs the schema); torch is imported by `reserve_rendezvous`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretBytes, model_validator

if TYPE_CHECKING:
    from torch.distributed import TCPStore

TRAINER_MEMBER = "trainer"
SyncBackend = Literal["gloo", "nccl", "cuda_ipc", "checkpoint"]
ChecksumName = Literal["xxh3_64", "crc32"]


class SyncGroupSpec(BaseModel):
    """One generation of a sync group: the trainer is rank 0, explorer workers are ranks 1..N.

    `generation` changes whenever membership changes (or after a failure): members of different
    generations never meet, because the process group lives under the store prefix `store_prefix`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    generation: int = Field(ge=0)
    backend: SyncBackend = "gloo"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535, description="0 until the trainer reserves one")
    world_size: int = Field(ge=1)
    ranks: dict[str, int] = Field(description="member id -> rank; the trainer ('trainer') is rank 0")
    timeout_s: float = Field(default=60.0, gt=0, description="bound on every collective of an update")
    join_timeout_s: float = Field(default=300.0, gt=0, description="bound on waiting for all members to join")
    bucket_mb: float = Field(default=64.0, gt=0, description="bytes per broadcast, in MiB (fractions allowed)")
    checksum: ChecksumName = "xxh3_64"
    checkpoint_dir: str | None = Field(default=None, description="shared directory; required for 'checkpoint'")
    # Never serialized, printed or carried to the next generation: the gateway makes one per generation.
    secret: SecretBytes | None = Field(
        default=None,
        exclude=True,
        repr=False,
        description="the generation's secret (a deployment with a token): members prove they hold it, weight "
        "checksums are keyed with it (trinity.sync.membership)",
    )

    @model_validator(mode="after")
    def _check_ranks(self) -> SyncGroupSpec:
        if self.ranks.get(TRAINER_MEMBER) != 0:
            raise ValueError(f"ranks: the trainer member '{TRAINER_MEMBER}' must be rank 0")
        if sorted(self.ranks.values()) != list(range(self.world_size)):
            raise ValueError(f"ranks: must assign each of 0..{self.world_size - 1} exactly once, got {self.ranks}")
        if self.backend == "checkpoint" and not self.checkpoint_dir:
            raise ValueError("checkpoint_dir: required when backend is 'checkpoint'")
        return self

    @classmethod
    def for_members(cls, name: str, generation: int, explorers: list[str], **fields: Any) -> SyncGroupSpec:
        """Ranks in the order given: `explorers[i]` gets rank i + 1."""
        ranks = {TRAINER_MEMBER: 0, **{member: i + 1 for i, member in enumerate(explorers)}}
        return cls(name=name, generation=generation, world_size=len(ranks), ranks=ranks, **fields)

    def rank_of(self, member: str) -> int:
        if member not in self.ranks:
            raise KeyError(f"{member!r} is not a member of sync group {self.name} generation {self.generation}")
        return self.ranks[member]

    def next_generation(self, explorers: list[str], **changes: object) -> SyncGroupSpec:
        """The spec after a membership change: same name and rendezvous, generation + 1 (and no secret unless
        `changes` give the new generation's)."""
        fields = self.model_dump(exclude={"name", "generation", "world_size", "ranks"})
        fields.update(changes)
        return SyncGroupSpec.for_members(self.name, self.generation + 1, explorers, **fields)

    @property
    def secret_bytes(self) -> bytes | None:
        return self.secret.get_secret_value() if self.secret is not None else None

    @property
    def store_prefix(self) -> str:
        return f"trinity-sync/{self.name}/g{self.generation}"

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * 2**20))

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s)

    @property
    def join_timeout(self) -> timedelta:
        return timedelta(seconds=self.join_timeout_s)

    @property
    def is_collective(self) -> bool:
        return self.backend != "checkpoint"


class Rendezvous:
    """The trainer's TCPStore master, bound before the spec is published so no other process can take the port.

    One reservation serves every generation of the group: generations differ by store prefix, not by port.
    """

    def __init__(self, store: TCPStore, spec: SyncGroupSpec) -> None:
        self.store: TCPStore | None = store
        self.spec = spec

    @property
    def port(self) -> int:
        if self.store is None:
            raise RuntimeError(f"the rendezvous of sync group {self.spec.name} is closed")
        return int(self.store.port)

    def next_generation(self, explorers: list[str], **changes: object) -> SyncGroupSpec:
        self.spec = self.spec.next_generation(explorers, **changes)
        return self.spec

    def close(self) -> None:
        # TCPStore has no explicit close; dropping the last reference stops the server thread.
        self.store = None


def reserve_rendezvous(spec: SyncGroupSpec) -> Rendezvous:
    """Bind the rendezvous store on the trainer; port 0 picks a free port, reported in `Rendezvous.spec`."""
    from torch.distributed import TCPStore

    store = TCPStore(
        spec.host, spec.port, spec.world_size, is_master=True, timeout=spec.join_timeout, wait_for_workers=False
    )
    return Rendezvous(store, spec.model_copy(update={"port": int(store.port)}))
