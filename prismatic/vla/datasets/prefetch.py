"""`BatchPrefetcher`: a loader's batches made ahead on a background thread (`--vla.speed.prefetch_batches N`).

`RLDSDataset` is read with `num_workers=0` (it holds one tf.data stream and its resumable position, so worker
processes are out), which puts the batch transform (tokenizer, image transform), the collator and the copy into
pinned memory between GPU steps, on the thread that launches the kernels. A daemon thread runs the loader's
iterator instead and keeps up to `depth` batches ready; `next()` takes the oldest. Same batches in the same order:
one thread iterates, as the loop would, and the transform and collator draw from no global RNG.

Resume stays exact: after each batch it made, the thread takes the stream's position (`position_marker`, called
on the thread that iterates the stream); the mark travels with the batch, and taking the batch tells the dataset
that its consumer stands there (`mark_consumed`). A checkpoint after k batches records k batches, however far
ahead the thread is.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader

logger = logging.getLogger(__name__)

_POLL_S = 0.05  # how often the waiting thread looks at the stop flag: the delay of `close()` when it waits
_JOIN_S = 30.0  # how long `close()` waits for the batch being made (e.g. a shuffle buffer still filling)


@runtime_checkable
class MarkedStream(Protocol):
    """A dataset whose position a prefetch thread can mark (`RLDSDataset`)."""

    def position_marker(self) -> Callable[[], Any]: ...

    def mark_consumed(self, mark: Any) -> None: ...


@dataclass(frozen=True)
class _Failure:
    """What the producer raised, re-raised by the consumer's `next()`."""

    error: BaseException


_END = object()  # the stream ended (a finite stream)


def _produce(
    batches: Iterator[Any],
    marker: Callable[[], Any] | None,
    ready: queue.SimpleQueue,
    slots: threading.Semaphore,
    stop: threading.Event,
    cuda_index: int | None,
) -> None:
    """The thread: a batch and its position mark for each free slot, until the end, an error or `stop`.

    Holds no reference to the `BatchPrefetcher`, so one dropped without `close()` is collected (and closes).
    """
    try:
        if cuda_index is not None:
            # Pinned memory is allocated on the current device, and a new thread's is device 0.
            torch.cuda.set_device(cuda_index)
        while not stop.is_set():
            if not slots.acquire(timeout=_POLL_S):
                continue
            if stop.is_set():
                return
            try:
                batch = next(batches)
            except StopIteration:
                ready.put(_END)
                return
            ready.put((batch, marker() if marker is not None else None))
    except BaseException as error:  # noqa: BLE001 (every error reaches the consumer, as without the thread)
        ready.put(_Failure(error))


class BatchPrefetcher:
    """Iterator over `loader`'s batches, made up to `depth` ahead on a daemon thread. Close it (or use it as a
    context manager) to stop the thread; errors of the loader are raised by `next()` unchanged, in order.

    Args:
        loader: the loader to iterate (its `pin_memory` decides the pinning, done on the thread). Iterated here,
            on the calling thread, so its stream opens before the thread starts; a dataset that is a
            `MarkedStream` gets the position of each batch the caller takes.
        depth: batches made ahead (>= 1).
        device: the run's device: a CUDA one is made current on the thread (no index: the caller's current one).
    """

    def __init__(self, loader: DataLoader, depth: int, device: torch.device | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1 (batches made ahead), got {depth}.")
        batches = iter(loader)
        self._dataset = loader.dataset if isinstance(loader.dataset, MarkedStream) else None
        marker = None
        if self._dataset is not None:
            marker = self._dataset.position_marker()
            self._dataset.mark_consumed(marker())  # nothing taken yet (before the thread runs)
        cuda_index = None
        if device is not None and device.type == "cuda":
            cuda_index = device.index if device.index is not None else torch.cuda.current_device()
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=_produce,
            args=(batches, marker, self._ready, self._slots, self._stop, cuda_index),
            name="batch-prefetch",
            daemon=True,
        )
        self.thread.start()
        self._closed = False

    @property
    def ready(self) -> int:
        """Batches made and not taken yet (at most `depth`; the end of the stream or an error counts as one)."""
        return self._ready.qsize()

    def __iter__(self) -> BatchPrefetcher:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        item = self._ready.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        batch, mark = item
        self._slots.release()
        if self._dataset is not None:
            self._dataset.mark_consumed(mark)
        return batch

    def close(self) -> None:
        """Stop the thread and wait for it (it finishes the batch it is making); batches made ahead are dropped.
        The dataset keeps the position of the last batch taken."""
        self._closed = True
        self._stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=_JOIN_S)
        if self.thread.is_alive():
            logger.warning(
                "The batch prefetch thread is still making a batch after %.0f s; left behind.", _JOIN_S
            )
        while not self._ready.empty():  # frees the pinned memory of the batches made ahead
            self._ready.get_nowait()

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


@contextlib.contextmanager
def prefetched(loader: DataLoader, depth: int, device: torch.device | None = None) -> Iterator[Iterator[Any]]:
    """`loader`'s batches: made `depth` ahead on a thread (stopped on leaving), or `iter(loader)` when `depth`
    is 0 (on the caller's thread, between steps)."""
    if depth == 0:
        yield iter(loader)
        return
    with BatchPrefetcher(loader, depth, device) as batches:
        yield batches
