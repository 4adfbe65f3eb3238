"""HTTP inference server for a `VLAPolicy`: OpenVLA's `/act` protocol in front of a dynamic batcher.

    python vla_scripts/serve.py --checkpoint runs/<run_id> [--port 8000] [--max_batch_size 16] [--max_wait_ms 5]

or, from Python (the app is an ordinary FastAPI app; the batcher starts and stops with its lifespan):

    app = create_app(load_policy("runs/<run_id>", device="cuda"), max_batch_size=16, max_wait_ms=5.0)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Endpoints:
- `POST /act` takes OpenVLA's payload `{"image": <json-numpy H x W x 3 uint8>, "instruction": str,
  "unnorm_key": str | null}` and answers the action as a json-numpy float64 array, so OpenVLA's client
  (`json_numpy.patch()` + `requests.post(...).json()`) works unchanged. OpenVLA's "double-encoded" form for
  clients without json-numpy patching, `{"encoded": json_numpy.dumps(payload)}`, is answered double-encoded too
  (a JSON string holding `json_numpy.dumps(action)`), as OpenVLA's `deploy.py` does. A policy trained with a chunk
  head answers the whole chunk, `(chunk_size, action_dim)`; one trained with proprio needs `"proprio"` (a list or
  array of numbers, robot units), and one trained with several cameras takes `"image"` as a list of the views.
- `GET /health`: `{"status": "ok", ...}` while the batcher runs (503 otherwise), with request / batch counts.
- `GET /metadata`: model id, source, device, dtype, unnorm keys, action dimension per key, the action head, chunk
  size, the camera views a request carries (their number and names, in order), proprio width, image size, whether
  training augmented images, batching settings: what a client needs to build its requests.

With `auth_token` (`serve.py --auth_token_env NAME` or `--auth_token_file PATH`; `prismatic/inference/auth.py`)
every endpoint but `/health` (a liveness probe that tells nothing of the model) needs the header
`Authorization: Bearer <token>`; without it, or with another token, the answer is 401 and nothing is decoded. The
token is never logged, echoed or reported.

Every request is validated in the handler, before it is queued, so a bad one is answered alone (400 for a body
that is not a JSON object, 413 for an oversized one, 422 for a bad field; `{"error": "<what to fix>"}`) and never
fails a batch of good ones. Valid requests wait in a queue; one worker thread takes up to `max_batch_size` of
them, waiting at most `max_wait_ms` after the first one arrived, and decodes them together with
`predict_action_batch` (rows may carry different unnorm keys; keys of different action dimensions go in separate
calls), one batch at a time, while the event loop keeps accepting. When a batch raises unexpectedly, its requests are retried one by one: those that fail alone are
answered 500 (`{"error": ...}`) and the server goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import json_numpy
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from prismatic.inference.auth import token_matches
from prismatic.inference.policy import DEFAULT_ACTION_DIM, PolicyInputError, VLAPolicy
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

PAYLOAD_FIELDS = ("image", "instruction", "unnorm_key", "proprio")
# Every row of a batch is padded to its longest prompt: one huge instruction would slow all the others down.
# Robot instructions are a sentence; this is two orders of magnitude above that.
MAX_INSTRUCTION_CHARS = 4096


class RequestError(Exception):
    """A request the server refuses: `status_code` (4xx) and a message saying what to fix."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


class BatcherStopped(RuntimeError):
    """The batcher is shutting down and takes no more work."""


@dataclass(frozen=True, eq=False)
class ActRequest:
    """One validated `/act` request. `unnorm_key` is resolved (None only for a policy without statistics)."""

    image: np.ndarray | list[np.ndarray]  # one camera image, or the views of a multi-camera policy
    instruction: str
    unnorm_key: str | None
    double_encoded: bool = False
    proprio: np.ndarray | None = None


# ---------------------------------------------------------------------------------------------------------------
# Request parsing and validation (event loop side)
# ---------------------------------------------------------------------------------------------------------------


def _decode_json(text: str | bytes, what: str) -> Any:
    try:
        return json_numpy.loads(text)
    # Any failure to decode (bad UTF-8, bad JSON, a corrupt json-numpy array, absurd nesting) is the client's.
    except Exception as e:  # noqa: BLE001
        raise RequestError(400, f"{what} is not valid JSON / json-numpy: {type(e).__name__}: {e}") from e


def parse_act_request(body: bytes, policy: VLAPolicy) -> ActRequest:
    """Decode and validate an `/act` body (plain or double-encoded) against `policy`.

    Raises:
        RequestError: 400 when the body is not a JSON object (or a malformed double-encoded one), 422 when a
            field is missing or wrong (the message names the field and what it should be).
    """
    payload = _decode_json(body, "The request body")
    double_encoded = isinstance(payload, dict) and "encoded" in payload
    if double_encoded:
        if set(payload) != {"encoded"}:
            raise RequestError(400, "A double-encoded request must hold the 'encoded' field only.")
        if not isinstance(payload["encoded"], str):
            raise RequestError(
                400,
                f"'encoded' must be a string (json_numpy.dumps(payload)), got {type(payload['encoded']).__name__}.",
            )
        payload = _decode_json(payload["encoded"], "'encoded'")
    if not isinstance(payload, dict):
        raise RequestError(
            400,
            f"The request must be a JSON object with fields {', '.join(PAYLOAD_FIELDS)}; "
            f"got {type(payload).__name__}.",
        )
    missing = [name for name in ("image", "instruction") if name not in payload]
    if missing:
        raise RequestError(
            422, f"Missing field(s) {', '.join(missing)}: an /act request needs image and instruction."
        )
    image, instruction, unnorm_key = payload["image"], payload["instruction"], payload.get("unnorm_key")
    views = policy.action_spec.num_images
    if views > 1:
        if not isinstance(image, list) or len(image) != views:
            raise RequestError(
                422,
                f"image must be a list of {views} json-numpy H x W x 3 uint8 arrays (primary, wrist, ...): this "
                f"policy reads {views} camera views; got {type(image).__name__}.",
            )
        try:
            image = [policy.check_image(view) for view in image]
        except PolicyInputError as e:
            raise RequestError(422, str(e)) from e
    elif not isinstance(image, np.ndarray):
        raise RequestError(
            422,
            f"image must be a json-numpy encoded H x W x 3 uint8 array (call json_numpy.patch() on the client, or "
            f"send the double-encoded form); got {type(image).__name__}.",
        )
    if not isinstance(instruction, str):
        raise RequestError(422, f"instruction must be a string, got {type(instruction).__name__}.")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise RequestError(
            422,
            f"instruction is {len(instruction)} characters long; at most {MAX_INSTRUCTION_CHARS} are served.",
        )
    if unnorm_key is not None and not isinstance(unnorm_key, str):
        raise RequestError(422, f"unnorm_key must be a string or null, got {type(unnorm_key).__name__}.")
    proprio = _proprio_field(payload.get("proprio"), policy)
    try:
        if views == 1:
            image = policy.check_image(image)
        # A policy without statistics answers normalised actions; naming a key for it is an error.
        key = policy.resolve_unnorm_key(unnorm_key) if policy.unnorm_keys or unnorm_key is not None else None
    except PolicyInputError as e:
        raise RequestError(422, str(e)) from e
    return ActRequest(image, instruction, key, double_encoded, proprio)


def _proprio_field(value: Any, policy: VLAPolicy) -> np.ndarray | None:
    """The request's proprio as float32 `[P]`, checked against what the policy reads (422 otherwise)."""
    width = policy.action_spec.proprio_dim
    if not width:
        if value is not None:
            raise RequestError(
                422, "proprio was sent, but this policy reads none (trained without use_proprio)."
            )
        return None
    if value is None:
        raise RequestError(
            422, f"Missing field proprio: this policy reads {width} proprio numbers per request."
        )
    try:
        proprio = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise RequestError(422, f"proprio must be {width} numbers, got {type(value).__name__}.") from e
    if proprio.shape != (width,) or not np.isfinite(proprio).all():
        raise RequestError(422, f"proprio must be {width} finite numbers, got shape {proprio.shape}.")
    return proprio


async def _read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused (413) as soon as it exceeds `max_bytes`, so an oversized upload is never held whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(413, f"Request body of {int(declared)} bytes exceeds the limit of {max_bytes}.")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(413, f"Request body exceeds the limit of {max_bytes} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------------------------
# Dynamic batching (worker thread side)
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Job(Generic[ItemT, ResultT]):
    item: ItemT
    future: Future[ResultT]
    enqueued_s: float


class DynamicBatcher(Generic[ItemT, ResultT]):
    """Runs `run_batch` on queued items in one worker thread, up to `max_batch_size` at a time.

    A batch closes when it is full or `max_wait_ms` after its first item was queued (items queued while the
    previous batch ran may already be past that, and are taken at once). One batch runs at a time, so the model
    sees one caller and the GPU one batch. `submit` is thread-safe and returns a `concurrent.futures.Future`.
    When a batch raises, its items are retried one by one, so only the items that fail alone get the exception.

    Args:
        run_batch: maps a list of items to one result per item, in order.
        max_batch_size: most items per batch (1: no batching).
        max_wait_ms: longest wait for more items after a batch's first one (0: take what is queued).
    """

    def __init__(
        self,
        run_batch: Callable[[list[ItemT]], Sequence[ResultT]],
        max_batch_size: int,
        max_wait_ms: float,
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be at least 1, got {max_batch_size}.")
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}.")
        self.run_batch, self.max_batch_size, self.max_wait_ms = run_batch, max_batch_size, max_wait_ms
        self.name = name
        self.requests_served = 0
        self.batches_run = 0
        self._queue: queue.SimpleQueue[_Job[ItemT, ResultT] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} was already started.")
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the queued items, then end the worker thread; later `submit` calls raise `BatcherStopped`."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def submit(self, item: ItemT) -> Future[ResultT]:
        future: Future[ResultT] = Future()
        with self._lock:  # no job may land behind the stop sentinel
            if self._stopping or self._thread is None:
                raise BatcherStopped(f"{self.name} is not running.")
            self._queue.put(_Job(item, future, time.monotonic()))
        return future

    def _loop(self) -> None:
        stop_seen = False
        while not stop_seen:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = first.enqueued_s + self.max_wait_ms / 1000
            while len(batch) < self.max_batch_size:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    stop_seen = True
                    break
                batch.append(job)
            self._run(batch)

    def _run(self, batch: list[_Job[ItemT, ResultT]]) -> None:
        # A future cancelled while queued (client gone) is dropped; the others can no longer be cancelled.
        jobs = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not jobs:
            return
        start = time.perf_counter()
        try:
            results = self._call(jobs)
        except Exception as e:  # noqa: BLE001 (answered per request; the worker must survive)
            logger.exception("A batch of %d request(s) failed", len(jobs))
            if len(jobs) == 1:
                jobs[0].future.set_exception(e)
                return
            # Whatever slipped past validation (or a batch too big for the device) fails only its own request:
            # each one is retried alone.
            for job in jobs:
                try:
                    job.future.set_result(self._call([job])[0])
                except Exception as row_error:  # noqa: BLE001
                    job.future.set_exception(row_error)
            return
        logger.debug("Batch of %d in %.1f ms", len(jobs), 1000 * (time.perf_counter() - start))
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)

    def _call(self, jobs: list[_Job[ItemT, ResultT]]) -> list[ResultT]:
        results = list(self.run_batch([job.item for job in jobs]))
        if len(results) != len(jobs):
            raise RuntimeError(f"run_batch returned {len(results)} results for {len(jobs)} items.")
        self.batches_run += 1
        self.requests_served += len(jobs)
        return results


def predict_batch(policy: VLAPolicy, requests: Sequence[ActRequest]) -> list[np.ndarray]:
    """Actions for validated requests, in order: one `predict_action_batch` per action dimension present.

    `predict_action_batch` decodes one number of tokens per batch, so rows whose unnorm keys have different
    action dimensions (a mixture of robots) go in separate calls; rows of one dimension share a call whatever
    their keys.
    """
    by_dim: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        dim = DEFAULT_ACTION_DIM if request.unnorm_key is None else policy.action_dim(request.unnorm_key)
        by_dim.setdefault(dim, []).append(index)
    actions: list[np.ndarray] = [np.empty(0)] * len(requests)
    for rows in by_dim.values():
        proprio = np.stack([requests[i].proprio for i in rows]) if policy.action_spec.proprio_dim else None
        batch = policy.predict_action_batch(
            [requests[i].image for i in rows],
            [requests[i].instruction for i in rows],
            unnorm_key=[requests[i].unnorm_key for i in rows],
            proprio=proprio,
        )
        for i, action in zip(rows, batch, strict=True):
            actions[i] = action
    return actions


def example_request(policy: VLAPolicy) -> ActRequest:
    """A valid request shaped as `policy` reads them: each of its camera views (black, at its image size), zero
    proprio of its width, its first unnorm key. `serve.py` warms up with it, so any policy the presets make (one
    camera or two, with proprio or without) starts."""
    height, width = policy.image_size
    views = [np.zeros((height, width, 3), dtype=np.uint8) for _ in policy.views]
    proprio_dim = policy.action_spec.proprio_dim
    proprio = np.zeros(proprio_dim, dtype=np.float32) if proprio_dim else None
    keys = policy.unnorm_keys
    image: np.ndarray | list[np.ndarray] = views if len(views) > 1 else views[0]
    return ActRequest(image, "warm up", keys[0] if keys else None, proprio=proprio)


# ---------------------------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------------------------


class BearerTokenAuth:
    """ASGI middleware: an HTTP request to any path but `open_paths` needs `Authorization: Bearer <token>`, else
    it is answered 401 before the app sees it (no body is read, nothing is queued). The token is never logged."""

    def __init__(self, app: ASGIApp, token: str, open_paths: Sequence[str] = ("/health",)) -> None:
        self.app, self._token, self.open_paths = app, token, frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if token_matches(header, self._token):
            await self.app(scope, receive, send)
            return
        reason = "no Authorization header" if header is None else "the Authorization header does not match"
        logger.warning("Refused %s %s (401): %s", scope["method"], scope["path"], reason)
        response = JSONResponse(
            {
                "error": f"This server requires a token ({reason}): send the header 'Authorization: Bearer "
                "<token>' with the token it was started with (serve.py --auth_token_env / --auth_token_file)."
            },
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)


def _error(status_code: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status_code)


def _action_response(action: np.ndarray, double_encoded: bool) -> Response:
    """json-numpy in the body (OpenVLA's client decodes it with `json_numpy.patch()`), or a JSON string holding
    it for double-encoded requests (decoded with `json_numpy.loads(response.json())`)."""
    encoded = json_numpy.dumps(action)
    return Response(json.dumps(encoded) if double_encoded else encoded, media_type="application/json")


def metadata(policy: VLAPolicy, max_batch_size: int, max_wait_ms: float) -> dict[str, Any]:
    """What `GET /metadata` answers: enough for a client to check it talks to the model it expects."""
    keys = policy.unnorm_keys
    return {
        "model_id": policy.model_id,
        "source": policy.source,
        "device": str(policy.device),
        "dtype": str(policy.dtype).removeprefix("torch."),
        "unnorm_keys": keys,
        "action_dim": {key: policy.action_dim(key) for key in keys},
        # Without statistics the server answers bin centres in [-1, 1] of this many dimensions.
        "normalized_action_dim": None if keys else DEFAULT_ACTION_DIM,
        "action_head": policy.action_spec.head,
        "chunk_size": policy.action_spec.chunk_size,
        "num_images": policy.action_spec.num_images,
        "views": list(policy.views),  # the order of a multi-camera request's "image" list
        "proprio_dim": policy.action_spec.proprio_dim,
        "image_size": list(policy.image_size),
        "trained_with_image_aug": policy.trained_with_image_aug,
        "max_batch_size": max_batch_size,
        "max_wait_ms": max_wait_ms,
    }


def create_app(
    policy: VLAPolicy,
    max_batch_size: int = 16,
    max_wait_ms: float = 5.0,
    max_request_bytes: int = 64 * 2**20,
    auth_token: str | None = None,
) -> FastAPI:
    """A FastAPI app serving `policy` (endpoints and protocol in the module docstring).

    The batcher's worker thread starts and stops with the app's lifespan (uvicorn runs it; so does
    `fastapi.testclient.TestClient` used as a context manager). With `auth_token`, every endpoint but `/health`
    needs `Authorization: Bearer <auth_token>` (`BearerTokenAuth`).

    Raises:
        ConfigError: `max_batch_size` < 1, `max_wait_ms` < 0, `max_request_bytes` < 1, or an empty `auth_token`.
    """
    if max_request_bytes < 1:
        raise ConfigError(f"max_request_bytes must be at least 1, got {max_request_bytes}.")
    if auth_token is not None and not auth_token.strip():
        raise ConfigError(
            "auth_token is empty: give the token requests must carry, or None for no authentication."
        )
    batcher: DynamicBatcher[ActRequest, np.ndarray] = DynamicBatcher(
        lambda requests: predict_batch(policy, requests), max_batch_size, max_wait_ms, name="vla-batcher"
    )
    if not policy.unnorm_keys:
        logger.warning(
            "'%s' carries no action statistics: /act answers normalised actions in [-1, 1].", policy.source
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            # Blocking join off the event loop: uvicorn has already drained in-flight requests.
            await asyncio.to_thread(batcher.stop)

    app = FastAPI(title="prismatic-vla policy server", lifespan=lifespan)
    app.state.batcher = batcher
    if auth_token is not None:  # FastAPI's own pages (/docs, /openapi.json) are behind it too
        app.add_middleware(BearerTokenAuth, token=auth_token)

    @app.post("/act")
    async def act(request: Request) -> Response:
        try:
            parsed = parse_act_request(await _read_body(request, max_request_bytes), policy)
        except RequestError as e:
            logger.warning("Refused an /act request (%d): %s", e.status_code, e)
            return _error(e.status_code, str(e))
        try:
            action = await asyncio.wrap_future(batcher.submit(parsed))
        except BatcherStopped as e:
            return _error(503, f"The server is shutting down: {e}")
        except Exception as e:  # noqa: BLE001 (logged with its traceback by the batcher)
            return _error(500, f"Inference failed: {type(e).__name__}: {e}")
        return _action_response(action, parsed.double_encoded)

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {
            "status": "ok" if batcher.running else "stopped",
            "requests_served": batcher.requests_served,
            "batches_run": batcher.batches_run,
        }
        return JSONResponse(body, status_code=200 if batcher.running else 503)

    @app.get("/metadata")
    async def get_metadata() -> dict[str, Any]:
        return metadata(policy, max_batch_size, max_wait_ms)

    return app
