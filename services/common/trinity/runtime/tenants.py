"""Named tokens (tenants) of a gateway, from the YAML file `TRINITY_TENANTS_FILE` names (docs/tenants.md).

The file lists each tenant's name, the SHA-256 of its bearer token (never the token: the file may sit in a
ConfigMap), its quotas and the highest priority it may give a run. The services' own token
(`TRINITY_AUTH_TOKEN`) stays the operator's: no quotas, every run. A caller is told apart by the digest of the token
it presents, looked up in a table: the digest of a secret token gives a timing side channel nothing to work with.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trinity.config.base import NAME_PATTERN
from trinity.config.errors import format_validation_error

MAX_PRIORITY = 100  # CreateRunRequest.priority runs 0 .. MAX_PRIORITY
BEARER = "Bearer "


def token_sha256(token: str) -> str:
    """What the file holds for `token`: `printf %s "$TOKEN" | sha256sum`."""
    return hashlib.sha256(token.encode()).hexdigest()


class Quotas(BaseModel):
    """What a tenant's runs may hold at once; an absent quota is unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runs: int | None = Field(default=None, ge=0, description="runs pending, running or paused")
    explorers: int | None = Field(
        default=None, ge=0, description="explorers of its running runs, and explorer.num_workers of any stage"
    )
    trainer_ranks: int | None = Field(default=None, ge=0, description="trainer ranks of any stage of one run")


class Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN.pattern, description="what its runs record as Run.tenant")
    token_sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$", description="hex SHA-256 of its bearer token")
    quotas: Quotas = Field(default_factory=Quotas)
    max_priority: int = Field(default=MAX_PRIORITY, ge=0, le=MAX_PRIORITY, description="highest priority of a run")

    @property
    def is_operator(self) -> bool:
        return not self.name


# The services' own token: no quotas, sees every run. Built without validation, as its empty name is no tenant's.
OPERATOR = Tenant.model_construct(name="", token_sha256="", quotas=Quotas(), max_priority=MAX_PRIORITY)


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path
    tenants: tuple[Tenant, ...] = ()

    @model_validator(mode="after")
    def _distinct(self) -> TenantsFile:
        for what, values in (("name", [t.name for t in self.tenants]), ("token_sha256", self.digests())):
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ValueError(f"tenants: two tenants share the {what} {twice[0]}")
        return self

    def digests(self) -> list[str]:
        return [t.token_sha256.lower() for t in self.tenants]

    @classmethod
    def load(cls, path: str | Path) -> TenantsFile:
        """The file at `path`; ValueError naming the file and the field for anything wrong with it."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"{path}: {err}") from None
        if not isinstance(data, dict) or set(data) != {"tenants"}:
            raise ValueError(f"{path}: must hold one key, tenants: a list of {{name, token_sha256, quotas, ...}}")
        try:
            return cls.model_validate({"path": path, "tenants": data["tenants"] or ()})
        except ValidationError as err:
            raise ValueError(f"{path}: {format_validation_error(err)}") from None


class TenantBook:
    """The tenants by the digest of their token."""

    def __init__(self, tenants: TenantsFile | None = None) -> None:
        self._by_digest = {t.token_sha256.lower(): t for t in (tenants.tenants if tenants else ())}

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def tenant(self, name: str) -> Tenant | None:
        return next((t for t in self._by_digest.values() if t.name == name), None)

    def caller(self, authorization: str) -> Tenant | None:
        """The tenant whose token an `authorization` header presents, or None."""
        if not self._by_digest or not authorization.startswith(BEARER):
            return None
        return self._by_digest.get(token_sha256(authorization.removeprefix(BEARER)))
