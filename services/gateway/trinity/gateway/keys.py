"""Redis keys of the Gateway (run state survives a gateway restart because it lives here)."""

PREFIX = "trinity:gw"
RUNS = f"{PREFIX}:runs"  # zset run id -> created ms
INSTANCES = f"{PREFIX}:instances"  # hash instance id -> Instance bytes


def run(run_id: str) -> str:
    return f"{PREFIX}:run:{{{run_id}}}"


def events(run_id: str) -> str:
    return f"{PREFIX}:run:{{{run_id}}}:events"


def event_id(run_id: str, event_id: str) -> str:
    """The seq under which a reported event was recorded (a retried report returns it instead)."""
    return f"{PREFIX}:run:{{{run_id}}}:event:{event_id}"


def spans(run_id: str) -> str:
    """The run's timeline: a sorted set of Span bytes scored by step (the newest TIMELINE_SPANS kept)."""
    return f"{PREFIX}:run:{{{run_id}}}:spans"


def sync_group(run_id: str) -> str:
    return f"{PREFIX}:run:{{{run_id}}}:sync"


def rank_secret(run_id: str) -> str:
    """The secret of the run's trainer ranks (docs/security.md, "Process groups")."""
    return f"{PREFIX}:run:{{{run_id}}}:rank-secret"


def lock(run_id: str) -> str:
    return f"{PREFIX}:run:{{{run_id}}}:lock"


def create_request(request_id: str) -> str:
    """The id of the run a CreateRun with this request id created (a repeated request returns that run)."""
    return f"{PREFIX}:create-request:{request_id}"
