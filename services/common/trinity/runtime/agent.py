"""A service's link to the Gateway: register on start, heartbeat, register again if forgotten."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from trinity.clients.gateway import GatewayClient
from trinity.runtime.logging import get_logger
from trinity.v1 import gateway_pb2

log = get_logger(__name__)


def has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


class GatewayAgent:
    """Keeps this instance registered; the run and stage it works on (`current_run()`) ride along on each
    heartbeat, so the gateway sees an assignment that never reached it."""

    def __init__(
        self, gateway: str, instance: gateway_pb2.Instance, current_run: Callable[[], tuple[str, int]] | None = None
    ) -> None:
        self.client = GatewayClient(gateway, timeout=10)
        self.instance = instance
        self.current_run = current_run or (lambda: ("", 0))
        self.interval = 1.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gateway-agent", daemon=True)

    def start(self) -> GatewayAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.client.close()

    def _register(self) -> None:
        self.instance.run_id, self.instance.stage = self.current_run()
        reply = self.client.register(self.instance)
        self.interval = reply.heartbeat_interval_seconds or 1.0
        log.info("gateway.registered", gateway=self.client.target, address=self.instance.address)

    def _loop(self) -> None:
        registered = False
        while not self._stop.is_set():
            try:
                if not registered:
                    self._register()
                    registered = True
                elif not self.client.heartbeat(self.instance.instance_id, *self.current_run()):
                    registered = False  # the gateway lost us (a restart without Redis state): register again
                    continue
            except grpc.RpcError as err:
                if registered:
                    log.warning("gateway.unreachable", error=err.code().name)
                registered = registered and err.code() != grpc.StatusCode.NOT_FOUND
            self._stop.wait(self.interval)
