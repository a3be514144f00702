"""The console's FastAPI app: the page (static files) and the JSON API of docs/console.md over the SDK."""

from __future__ import annotations

import asyncio
import html
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from trinity.clients import BufferClient
from trinity.console import auth, configs, runs
from trinity.console.settings import ConsoleSettings
from trinity.runtime.errors import one_line
from trinity.runtime.logging import get_logger
from trinity.runtime.spans import span_json
from trinity.sdk import (
    AsyncRunHandle,
    AsyncTrinityClient,
    GatewayUnavailable,
    InvalidRequest,
    NotPermitted,
    QuotaExceeded,
    RunConflict,
    RunNotFound,
    TrinityClient,
    TrinityError,
)
from trinity.sdk.client import TERMINAL

log = get_logger(__name__)

STATIC = Path(__file__).parent / "static"
# The page's third-party code, vendored in the package (static/vendor/SOURCES.json says what each file is).
VENDOR_ASSETS = ("uplot.js", "uplot.css", "js-yaml.js")
LOADING = "<p>Loading…</p>"
EVAL_SNAPSHOT_S = 1.0  # a live run's recorded events arrive within this; a finished run's stream just ends
HEALTH_TIMEOUT_S = 2.0
KEEPALIVE_S = 15.0
T = TypeVar("T")


class ConfigText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    yaml: str


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str


class SteerBody(BaseModel):
    """The knobs to change; bounds are the gateway's (one check for every client), its messages passed on."""

    model_config = ConfigDict(extra="forbid")
    pause_exploration: bool | None = None
    temperature: float | None = None
    learning_rate: float | None = None


class ScaleBody(BaseModel):
    """The explorers the run should have. The bounds are the gateway's (1 .. the sync group's limit), its message
    passed on; here only what the request's int32 can carry."""

    model_config = ConfigDict(extra="forbid")
    explorers: int = Field(ge=-(2**31), le=2**31 - 1)


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = "paused from the console"


def _errors(status: int, problems: list[dict[str, str]]) -> JSONResponse:
    return JSONResponse({"errors": problems}, status_code=status)


def _detail(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def _field_problem(message: str, strip: str = "") -> dict[str, str]:
    """`steering.temperature: must be ...` -> {"field": "temperature", "message": "must be ..."}."""
    field, sep, rest = message.partition(": ")
    if sep and " " not in field:
        return {"field": field.removeprefix(strip), "message": rest}
    return {"field": "", "message": message}


async def _with_keepalives(events: AsyncIterator[T], every_s: float = KEEPALIVE_S) -> AsyncIterator[T | None]:
    """`events`, with None whenever `every_s` pass without one. The watch runs in a task of its own (a timeout
    on the watch itself would cancel it); closing this generator (the page went away) cancels that task."""
    queue: asyncio.Queue[tuple[T | None, BaseException | None, bool]] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in events:
                await queue.put((event, None, False))
        except Exception as err:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put((None, err, True))
        else:
            await queue.put((None, None, True))

    task = asyncio.create_task(pump())
    try:
        while True:
            try:
                event, error, done = await asyncio.wait_for(queue.get(), every_s)
            except TimeoutError:
                yield None
                continue
            if error is not None:
                raise error
            if done:
                return
            yield event
    finally:
        task.cancel()


def missing_assets(static: Path | None = None) -> list[str]:
    """The vendored files the page imports that this install lacks (`vendor/uplot.js`, ...); empty when complete."""
    vendor = (static or STATIC) / "vendor"
    return [f"vendor/{name}" for name in VENDOR_ASSETS if not (vendor / name).is_file()]


def assets_problem(missing: list[str]) -> str:
    """What a console without its vendored files tells the log and the page (they ship with every install of
    trinity-console; a copy of the source folder without them is incomplete)."""
    return (
        f"the console page cannot load: {', '.join(missing)} missing from {STATIC}. They ship in the trinity-console "
        "package (in git, static/vendor/): reinstall it, or in a checkout restore them (`git checkout`) or rebuild "
        "them from npm (`make console-assets`)"
    )


def create_app(settings: ConsoleSettings | None = None) -> FastAPI:
    settings = settings or ConsoleSettings.from_env()
    missing = missing_assets()
    if missing:
        log.warning("console.assets_missing", missing=missing, problem=assets_problem(missing))
    client = TrinityClient(settings.gateway, token=settings.token)
    probe = TrinityClient(settings.gateway, token=settings.token, timeout=HEALTH_TIMEOUT_S)
    watchers: dict[str, AsyncTrinityClient] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The event streams use the asyncio client, on the server's loop: a closed page cancels its watch at once.
        watchers["client"] = AsyncTrinityClient(settings.gateway, token=settings.token)
        try:
            yield
        finally:
            await watchers.pop("client").close()
            client.close()
            probe.close()

    app = FastAPI(title="Trinity console", lifespan=lifespan, docs_url=None, redoc_url=None)

    # ---- errors ----------------------------------------------------------------------------------------

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = []
        for problem in err.errors():
            loc = [str(p) for p in problem["loc"] if p not in ("body", "query", "path")]
            message = "unknown field" if problem["type"] == "extra_forbidden" else problem["msg"]
            problems.append({"field": ".".join(loc), "message": message})
        return _errors(400, problems)

    @app.exception_handler(RunNotFound)
    async def not_found(request: Request, err: RunNotFound) -> JSONResponse:
        return _detail(404, str(err))

    @app.exception_handler(RunConflict)
    async def conflict(request: Request, err: RunConflict) -> JSONResponse:
        return _detail(409, str(err))

    @app.exception_handler(InvalidRequest)
    async def invalid(request: Request, err: InvalidRequest) -> JSONResponse:
        return _errors(400, [_field_problem(str(err))])

    @app.exception_handler(QuotaExceeded)
    async def over_quota(request: Request, err: QuotaExceeded) -> JSONResponse:
        return _detail(429, str(err))

    @app.exception_handler(NotPermitted)
    async def not_permitted(request: Request, err: NotPermitted) -> JSONResponse:
        return _detail(403, str(err))

    @app.exception_handler(GatewayUnavailable)
    async def unavailable(request: Request, err: GatewayUnavailable) -> JSONResponse:
        return _detail(503, str(err))

    @app.exception_handler(TrinityError)
    async def refused(request: Request, err: TrinityError) -> JSONResponse:
        return _detail(502, str(err))

    @app.exception_handler(grpc.RpcError)
    async def buffer_error(request: Request, err: grpc.RpcError) -> JSONResponse:
        return _detail(503, f"the buffer did not answer: {one_line(err)}")

    # ---- authentication ---------------------------------------------------------------------------------

    @app.middleware("http")
    async def require_token(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path, given = request.url.path, auth.presented_token(request)
        if settings.token and auth.needs_token(path) and not auth.token_matches(settings.token, given):
            return _detail(401, "this console requires the services' token: POST /api/login {token}, or send it as "
                           "Authorization: Bearer <token>")  # fmt: skip
        return await call_next(request)

    @app.post("/api/login")
    def login(body: Login) -> Response:
        if settings.token and not auth.token_matches(settings.token, body.token):
            return _detail(401, "wrong token")
        response = JSONResponse({"ok": True})
        if settings.token:
            response.set_cookie(auth.COOKIE, body.token, httponly=True, samesite="strict")
        return response

    @app.post("/api/logout")
    def logout() -> Response:
        response = JSONResponse({"ok": True})
        response.delete_cookie(auth.COOKIE)
        return response

    # ---- the page --------------------------------------------------------------------------------------

    @app.get("/health")
    def health() -> dict[str, Any]:
        try:
            probe.list_runs()
            gateway = True
        except TrinityError:
            gateway = False
        return {"status": "ok", "gateway": gateway}

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        page = STATIC / "index.html"
        if not page.is_file():
            return _detail(404, f"the console page is not built ({page} is missing)")
        if not missing:
            return FileResponse(page)
        # Without its libraries the page's scripts cannot load and would leave "Loading…" up: say why instead.
        alert = f'<p class="error" role="alert" id="assets-missing">{html.escape(assets_problem(missing))}</p>'
        return HTMLResponse(page.read_text().replace(LOADING, alert), status_code=500)

    if STATIC.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # ---- configure -------------------------------------------------------------------------------------

    @app.get("/api/schema")
    def schema() -> dict[str, Any]:
        return {
            "schema": configs.schema(),
            "registries": configs.registries(),
            "examples": configs.examples(settings.examples_dir),
        }

    @app.post("/api/validate")
    def validate(body: ConfigText) -> dict[str, Any]:
        config, problems = configs.validate(body.yaml)
        return {
            "ok": config is not None,
            "errors": problems,
            "config": config.model_dump(mode="json") if config is not None else None,
        }

    # ---- runs ------------------------------------------------------------------------------------------

    @app.get("/api/runs")
    def list_runs() -> dict[str, Any]:
        found = sorted(client.list_runs(), key=lambda r: r.created_unix_ms, reverse=True)
        position = {run.id: n for n, run in enumerate(runs.queue(found), start=1)}
        return {"runs": [{**runs.summary(r), "queue_position": position.get(r.id)} for r in found]}

    @app.post("/api/runs")
    def create_run(body: ConfigText) -> Response:
        config, problems = configs.validate(body.yaml)
        if config is None:
            return _errors(400, problems)
        handle = client.create_run(config.model_dump_json())
        log.info("console.run_created", run_id=handle.id)
        return JSONResponse({"run_id": handle.id})

    @app.get("/api/runs/{run_id}")
    def get_run(run_id: str) -> dict[str, Any]:
        run = client.run(run_id).status()
        view = runs.with_config(run)
        view["services"] = runs.services(run, client.instances())
        view["accounting"] = runs.accounting(_stream_stats(run))
        return view

    def _stream_stats(run: Any) -> Any:
        address = runs.buffer_address(client)
        if address is None:
            return None
        with BufferClient(address, token=settings.token) as buffer:
            return runs.stream_stats(buffer, runs.experience_stream(run))

    @app.post("/api/runs/{run_id}/cancel")
    def cancel_run(run_id: str) -> dict[str, Any]:
        return runs.with_config(client.run(run_id).cancel("cancelled from the console"))

    @app.post("/api/runs/{run_id}/scale")
    def scale_run(run_id: str, body: ScaleBody) -> dict[str, Any]:
        return runs.with_config(client.scale_run(run_id, body.explorers))

    @app.post("/api/runs/{run_id}/pause")
    def pause_run(run_id: str, body: PauseBody | None = None) -> dict[str, Any]:
        return runs.with_config(client.pause_run(run_id, (body or PauseBody()).reason))

    @app.post("/api/runs/{run_id}/resume")
    def resume_run(run_id: str) -> dict[str, Any]:
        return runs.with_config(client.resume_run(run_id))

    @app.get("/api/runs/{run_id}/events")
    async def events(run_id: str, request: Request, after: str = "") -> Response:
        await asyncio.to_thread(client.run, run_id)  # an unknown run is a 404, not an empty stream
        after = after or request.headers.get("last-event-id", "")
        handle = AsyncRunHandle(watchers["client"], run_id)

        async def stream() -> AsyncIterator[str]:
            async for event in _with_keepalives(handle.watch(after)):
                if event is None:
                    yield ": keepalive\n\n"  # a comment line: keeps proxies from closing a quiet stream
                else:
                    yield f"id: {event.seq}\ndata: {json.dumps(runs.event_json(event))}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.get("/api/runs/{run_id}/experiences")
    def experiences(
        run_id: str,
        limit: int = Query(50, ge=1, le=500),
        min_reward: float | None = None,
        max_reward: float | None = None,
        version: int | None = None,
    ) -> dict[str, Any]:
        run = client.run(run_id).status()
        address = runs.buffer_address(client)
        if address is None:
            return _detail(503, "no live buffer is registered with the gateway")  # type: ignore[return-value]
        with BufferClient(address, token=settings.token) as buffer:
            try:
                reply = buffer.sample(
                    runs.experience_stream(run),
                    limit,
                    min_reward=min_reward,
                    max_reward=max_reward,
                    model_version=version,
                )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return {"experiences": []}  # the stream is not there yet
        return {"experiences": [runs.experience_json(i.entry_id, i.experience) for i in reply.items]}

    @app.get("/api/runs/{run_id}/spans")
    def spans(run_id: str, since_step: int = Query(0, ge=0)) -> dict[str, Any]:
        return {"spans": [span_json(span) for span in client.spans(run_id, since_step)]}

    @app.get("/api/runs/{run_id}/evals")
    def evals(run_id: str) -> dict[str, Any]:
        handle = client.run(run_id)
        snapshot = EVAL_SNAPSHOT_S if handle.status().state not in TERMINAL else 60.0
        rows = handle.metrics(snapshot_seconds=snapshot).eval
        meta = ("step", "model_version", "stage", "unix_ms")
        return {
            "evals": [
                {"model_version": int(row["model_version"]), "metrics": {k: v for k, v in row.items() if k not in meta}}
                for row in rows
            ]
        }

    # ---- steer -----------------------------------------------------------------------------------------

    @app.post("/api/runs/{run_id}/steer")
    def steer(run_id: str, body: SteerBody) -> Response:
        try:
            reply = client.steer_run(
                run_id,
                pause_exploration=body.pause_exploration,
                temperature=body.temperature,
                learning_rate=body.learning_rate,
            )
        except InvalidRequest as err:
            return _errors(400, [_field_problem(str(err), strip="steering.")])
        return JSONResponse({"applied": list(reply.applied)})

    return app
