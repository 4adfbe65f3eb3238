"""Inference throughput of the policy: `predict_action` latency and `predict_action_batch` actions/s.

    python benchmarks/bench_predict.py [--checkpoint runs/demo] [--device cpu] [--batch_sizes 1 8 32]

Without `--checkpoint` it measures the tiny preset (`tiny-vit+tiny-llama`, random weights, 7-D actions) on
64x64 images. Prints p50 / p90 latency of single `predict_action` calls, then for each batch size the actions/s
of KV-cached decoding and of re-running the full sequence every step (`use_cache=False`, what Hugging Face's
`generate` does without a cache), and the two targets: batch 32 >= 8x the actions/s of batch 1, and KV-cached
decoding >= 2x faster than re-running. Then the chunk head (OpenVLA-OFT's parallel decoding, `--chunk_size` actions
per forward) against the tokens head on the same tiny model and batch: actions/s of each and their ratio (target:
the chunk head >= 10x the tokens head's actions/s at K = 8).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

TINY_BASE_VLM = "tiny-vit+tiny-llama"


def tiny_policy(device: str):
    """The tiny preset as a policy, with statistics for one 7-D dataset ("bench")."""
    from prismatic.inference.policy import VLAPolicy, resolve_device_dtype
    from prismatic.models import build_vlm

    torch.manual_seed(0)
    stats = {"q01": [-1.0] * 7, "q99": [1.0] * 7, "mask": [True] * 6 + [False]}
    device_t, dtype = resolve_device_dtype(device, None)
    return VLAPolicy(build_vlm(TINY_BASE_VLM), {"bench": {"action": stats}}, TINY_BASE_VLM, device_t, dtype)


def tiny_chunk_policy(device: str, chunk_size: int):
    """The same tiny model with an l1-chunk head (random weights) reading `chunk_size` 7-D actions per forward."""
    from prismatic.inference.policy import VLAPolicy, resolve_device_dtype
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec

    torch.manual_seed(0)
    vlm = build_vlm(TINY_BASE_VLM)
    vlm.attach_action_modules(ActionSpec(head="l1-chunk", chunk_size=chunk_size, action_dim=7))
    stats = {"q01": [-1.0] * 7, "q99": [1.0] * 7, "mask": [True] * 6 + [False]}
    device_t, dtype = resolve_device_dtype(device, None)
    return VLAPolicy(vlm, {"bench": {"action": stats}}, TINY_BASE_VLM, device_t, dtype)


def requests_for(policy, batch_size: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[str]]:
    height, width = policy.vlm.vision_backbone.default_image_resolution[1:]
    images = [rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8) for _ in range(batch_size)]
    tasks = ["pick up the red block", "push the can to the left", "lift the sponge", "open the drawer"]
    return images, [tasks[i % len(tasks)] for i in range(batch_size)]


def timed(fn, min_seconds: float, min_calls: int = 3) -> list[float]:
    """Seconds per call of `fn` (after one warm-up call), for at least `min_calls` calls and `min_seconds`."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--checkpoint", default=None, help="anything load_policy takes (default: tiny preset)"
    )
    parser.add_argument("--unnorm_key", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=3.0, help="minimum measuring time per figure")
    parser.add_argument(
        "--chunk_size", type=int, default=8, help="K of the chunk-head comparison (tiny model)"
    )
    parser.add_argument("--chunk_batch_size", type=int, default=8, help="batch of the chunk-head comparison")
    args = parser.parse_args()

    if args.checkpoint is None:
        policy, key = tiny_policy(args.device), "bench"
    else:
        from prismatic.inference import load_policy

        policy = load_policy(args.checkpoint, device=args.device)
        key = policy.resolve_unnorm_key(args.unnorm_key)
    rng = np.random.default_rng(0)
    print(
        f"model {policy.model_id} on {policy.device} ({policy.dtype}), {policy.action_dim(key)}-D actions, "
        f"torch threads {torch.get_num_threads()}"
    )

    images, tasks = requests_for(policy, 1, rng)
    latencies = timed(lambda: policy.predict_action(images[0], tasks[0], unnorm_key=key), args.seconds, 20)
    q = statistics.quantiles(latencies, n=10)
    print(f"predict_action latency: p50 {1e3 * statistics.median(latencies):.1f} ms, p90 {1e3 * q[8]:.1f} ms")

    cached: dict[int, float] = {}
    print(f"{'batch':>5} {'cached actions/s':>17} {'re-run actions/s':>17} {'cache speed-up':>15}")
    for batch_size in args.batch_sizes:
        images, tasks = requests_for(policy, batch_size, rng)
        with_cache = timed(lambda ims=images, ts=tasks: policy.decode_batch(ims, ts, key), args.seconds)
        rerun = timed(
            lambda ims=images, ts=tasks: policy.decode_batch(ims, ts, key, use_cache=False), args.seconds
        )
        cached[batch_size] = batch_size / statistics.median(with_cache)
        rerun_rate = batch_size / statistics.median(rerun)
        print(
            f"{batch_size:>5} {cached[batch_size]:>17.1f} {rerun_rate:>17.1f} {cached[batch_size] / rerun_rate:>14.2f}x"
        )
    if 1 in cached and 32 in cached:
        ratio = cached[32] / cached[1]
        print(
            f"batch 32 vs batch 1: {ratio:.1f}x actions/s (target >= 8x: {'met' if ratio >= 8 else 'MISSED'})"
        )
    compare_heads(args.device, args.chunk_size, args.chunk_batch_size, args.seconds, rng)


def compare_heads(
    device: str, chunk_size: int, batch_size: int, seconds: float, rng: np.random.Generator
) -> None:
    """Actions/s of the tiny model's tokens head (one forward per action dimension, KV-cached) and of its l1-chunk
    head (every action of a K-chunk in one forward), on the same batch of requests."""
    tokens, chunk = tiny_policy(device), tiny_chunk_policy(device, chunk_size)
    images, tasks = requests_for(tokens, batch_size, rng)
    token_s = statistics.median(timed(lambda: tokens.predict_action_batch(images, tasks, "bench"), seconds))
    chunk_s = statistics.median(timed(lambda: chunk.predict_action_batch(images, tasks, "bench"), seconds))
    token_rate, chunk_rate = batch_size / token_s, batch_size * chunk_size / chunk_s
    ratio = chunk_rate / token_rate
    print(f"heads, tiny model, batch {batch_size}: actions/s (one action = one 7-D robot command)")
    print(
        f"  tokens   (7 forwards, 1 action): {token_rate:>10.1f} actions/s, {1e3 * token_s:.1f} ms per batch"
    )
    print(
        f"  l1-chunk (1 forward, K={chunk_size}):     {chunk_rate:>10.1f} actions/s, {1e3 * chunk_s:.1f} ms per batch"
    )
    print(
        f"  l1-chunk vs tokens: {ratio:.1f}x actions/s (target >= 10x: {'met' if ratio >= 10 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
