"""Where a simulator rollout gets its actions: a policy in this process, or a running `serve.py`.

Both take a batch of observations already prepared by the protocol (`PolicyQuery`) and answer one action chunk
`(chunk, action_dim)` per query, un-normalised with the suite's statistics: a tokens head gives a chunk of one,
an l1-chunk head its `chunk_size`. The server is driven with OpenVLA's `/act` payload, one HTTP request per query,
sent concurrently so that its dynamic batcher decodes them together (GPU server, CPU simulators).

A source may also say which of its chunks are stand-ins for an answer that did not decode (FAST's zeros): its
`act` then returns `Chunks` with `valid`, which the rollout counts per episode. The in-process source does, for a
head that reports it (`HeadPrediction.valid`); the server's `/act` answer carries only the actions.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import json_numpy
import numpy as np

from prismatic.inference.auth import bearer_header
from prismatic.util.errors import ConfigError

SERVER_TIMEOUT_S = 300.0  # one /act answer; a batch of 7B decodes on a busy GPU stays well under it


@dataclass(frozen=True)
class PolicyQuery:
    """One environment's request for actions: its camera views (primary first, as the policy reads them, already
    resized / cropped), the task's instruction and, for a policy that reads it, the proprio state."""

    views: tuple[np.ndarray, ...]
    instruction: str
    proprio: np.ndarray | None = None


@dataclass(frozen=True)
class PolicyFacts:
    """What the rollout needs to know of the policy, whichever side of HTTP it runs."""

    image_size: tuple[int, int]  # (H, W) the model's images are resized to
    num_images: int  # camera views per request (1: primary; 2: primary + wrist)
    proprio_dim: int  # 0 when the policy reads no proprio
    chunk_size: int  # actions per prediction
    unnorm_keys: tuple[str, ...]  # statistics the checkpoint carries
    trained_with_image_aug: bool | None  # None: unknown (not recorded where the checkpoint came from)
    action_dims: dict[str, int] = field(default_factory=dict)  # numbers per action, by statistics key


class Chunks(list):
    """`act`'s answer when the source knows which chunks decoded: the chunks (a list, as any source answers), and
    `valid`, one bool per chunk (False: the head's stand-in for ids that did not decode)."""

    def __init__(self, chunks: Sequence[np.ndarray], valid: Sequence[bool]) -> None:
        super().__init__(chunks)
        self.valid = [bool(v) for v in valid]


class ActionSource(Protocol):
    """Answers action chunks for a batch of queries."""

    facts: PolicyFacts

    def act(self, queries: Sequence[PolicyQuery], unnorm_key: str) -> list[np.ndarray]:
        """One `(chunk, action_dim)` float64 chunk per query, un-normalised with `unnorm_key` (a `Chunks` when
        the source knows which decoded)."""
        ...

    def close(self) -> None:
        """Release what the source holds (threads, connections)."""
        ...


def _as_chunk(action: np.ndarray) -> np.ndarray:
    action = np.asarray(action, dtype=np.float64)
    return action[None] if action.ndim == 1 else action


class InProcessSource:
    """A `VLAPolicy` in this process: every query of a step is decoded in one `decode_batch` call."""

    def __init__(self, policy: Any, trained_with_image_aug: bool | None) -> None:
        self.policy = policy
        spec = policy.action_spec
        self.facts = PolicyFacts(
            image_size=policy.image_size,
            num_images=spec.num_images,
            proprio_dim=spec.proprio_dim,
            chunk_size=spec.chunk_size,
            unnorm_keys=tuple(policy.unnorm_keys),
            trained_with_image_aug=trained_with_image_aug,
            action_dims={key: policy.action_dim(key) for key in policy.unnorm_keys},
        )

    def act(self, queries: Sequence[PolicyQuery], unnorm_key: str) -> list[np.ndarray]:
        images = [list(q.views) if len(q.views) > 1 else q.views[0] for q in queries]
        proprio = np.stack([q.proprio for q in queries]) if self.facts.proprio_dim else None
        decoded = self.policy.decode_batch(
            images, [q.instruction for q in queries], unnorm_key, proprio=proprio
        )
        chunks = [_as_chunk(a) for a in decoded.actions]
        return chunks if decoded.valid is None else Chunks(chunks, decoded.valid)

    def close(self) -> None:
        """Nothing to release: the policy belongs to the caller."""


class ServerSource:
    """A running `vla_scripts/serve.py` at `url` (e.g. http://gpu-host:8000), asked with OpenVLA's payload.

    With `auth_token`, every request carries `Authorization: Bearer <token>` (a server started with one).

    Raises (on construction):
        ConfigError: the server does not answer `/metadata`, refuses the token (401), or answers something that is
            not a policy server.
    """

    def __init__(
        self, url: str, max_concurrent: int, image_aug: bool | None = None, auth_token: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = bearer_header(auth_token) if auth_token is not None else {}
        meta = self._get("/metadata")
        try:
            self.facts = PolicyFacts(
                image_size=tuple(meta["image_size"]),
                num_images=int(meta["num_images"]),
                proprio_dim=int(meta["proprio_dim"] or 0),
                chunk_size=int(meta["chunk_size"]),
                unnorm_keys=tuple(meta["unnorm_keys"]),
                trained_with_image_aug=meta.get("trained_with_image_aug") if image_aug is None else image_aug,
                action_dims={key: int(dim) for key, dim in (meta.get("action_dim") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"--policy_url {url} answered /metadata without the fields of a vla_scripts/serve.py policy "
                f"server ({e!r}). Point it at a running serve.py (python vla_scripts/serve.py --checkpoint ...)."
            ) from e
        self._pool = ThreadPoolExecutor(max(1, max_concurrent), thread_name_prefix="sim-act")

    def _get(self, path: str) -> dict[str, Any]:
        try:
            request = urllib.request.Request(self.url + path, headers=self._headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            if isinstance(e, urllib.error.HTTPError) and e.code == 401:
                raise ConfigError(self._token_refused()) from e
            raise ConfigError(
                f"--policy_url {self.url} does not answer {path} ({e}). Start the server first "
                "(python vla_scripts/serve.py --checkpoint <run> --host 0.0.0.0 --port 8000), check the host and "
                "port, and that this machine can reach it."
            ) from e

    def _post(self, query: PolicyQuery, unnorm_key: str) -> np.ndarray:
        payload: dict[str, Any] = {
            "image": list(query.views) if len(query.views) > 1 else query.views[0],
            "instruction": query.instruction,
            "unnorm_key": unnorm_key,
        }
        if query.proprio is not None:
            payload["proprio"] = query.proprio
        request = urllib.request.Request(
            self.url + "/act",
            data=json_numpy.dumps(payload).encode(),
            headers={"Content-Type": "application/json", **self._headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=SERVER_TIMEOUT_S) as response:
                return _as_chunk(json_numpy.loads(response.read()))
        except urllib.error.HTTPError as e:
            if e.code == 401:
                raise ConfigError(self._token_refused()) from e
            raise ConfigError(
                f"--policy_url {self.url} refused an /act request ({e.code}): {e.read().decode(errors='replace')}"
            ) from e
        except (urllib.error.URLError, OSError) as e:
            raise ConfigError(
                f"--policy_url {self.url} stopped answering during the evaluation ({e}); is the server still up?"
            ) from e

    def _token_refused(self) -> str:
        """What to do about a 401 (the token itself is never shown)."""
        what = "rejected the token given" if self._headers else "requires a token"
        return (
            f"--policy_url {self.url} {what} (401): pass the one its serve.py was started with (--auth_token_env / "
            "--auth_token_file) as --policy_auth_token_env NAME (an environment variable holding it) or "
            "--policy_auth_token_file PATH."
        )

    def act(self, queries: Sequence[PolicyQuery], unnorm_key: str) -> list[np.ndarray]:
        return list(self._pool.map(lambda q: self._post(q, unnorm_key), queries))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
