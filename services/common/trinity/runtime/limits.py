"""How much a client may send in one request: the bounds every service checks, in one place.

Plain numbers, importable without grpc (the config parser uses them too). `trinity.runtime.errors` turns a
value past its bound into INVALID_ARGUMENT naming the field; docs/security.md lists them for operators.
"""

from __future__ import annotations

# A name or id: streams, task sets, consumers, runs, instances, lease and entry ids. Config names are at
# most 128 characters; run-scoped names prefix them with the run id and stage.
MAX_NAME_CHARS = 512
# A file path a client names (Linux PATH_MAX).
MAX_PATH_CHARS = 4096
# A free-text field that ends up in run state or a log: event messages, cancel reasons, reported errors.
MAX_TEXT_CHARS = 64 * 1024
# A run config's YAML or JSON text: the largest example is 3 KB.
MAX_CONFIG_BYTES = 1 << 20
# Entries of one repeated or map field in one request (ids, results, experiences, metrics, stop strings).
MAX_ITEMS = 10_000
# Prompt plus response tokens of one experience: the longest contexts of current models are 1 M tokens.
MAX_EXPERIENCE_TOKENS = 1 << 20
# Generate: samples of one prompt, the prompt's text (about a million tokens), stop strings (each is matched
# against every sampled token).
MAX_GENERATE_SAMPLES = 64
MAX_PROMPT_CHARS = 4 << 20
MAX_STOP_STRINGS = 64
# The smallest temperature above 0 (greedy): logits divided by less overflow to inf (vLLM's own threshold).
MIN_TEMPERATURE = 1e-5
# Explorer workers in one weight-sync group (ranks are int32 and the trainer waits for each).
MAX_SYNC_WORKERS = 4096
# Seconds a sync-group operation may be given (a day), and the largest weight bucket (64 GiB).
MAX_SYNC_TIMEOUT_SECONDS = 86_400.0
MAX_BUCKET_MB = 65_536.0
# Runs a gateway holds that have not ended (PENDING or RUNNING); each waits for services in its own thread.
MAX_ACTIVE_RUNS = 16
# Bytes of a status message sent back (gRPC's default metadata limit is 8 KiB, and the message is
# percent-encoded, up to 3 bytes per byte): a longer one is cut, so the status itself always arrives.
MAX_ERROR_DETAIL_BYTES = 1024
