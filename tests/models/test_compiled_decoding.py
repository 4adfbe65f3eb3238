"""`compile_steps`: the static cache's decode step compiled by `torch.compile` (inductor; C++ kernels on CPU) gives
the dynamic KV cache's ids, for a single request and a batch of different prompt lengths, constrained or not, with
each decoder layer compiled (`compile_scope="layers"`, the default) or the step whole; one compiled step serves
every later batch size and prompt length (compiled for one request and once more for larger batches); compiled by
layers, a deeper model compiles no more graphs; a compile failure falls back to the uncompiled functions with one
WARNING; the policy's options and the scripts' `--compile_decoding` flag reach `greedy_decode`; the server warms up
a single request too.

On CPU only the decode step is compiled here (`static_decoding.COMPILED`): compiling the prefill too, vision
backbone included, works the same way but takes 30-50 s more on one core. The reference is `greedy_decode`'s
dynamic-cache path (itself pinned against re-running the full sequence)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scripts import import_script
from torch._dynamo.utils import counters
from train_runs import free_port

from prismatic.inference import VLAPolicy
from prismatic.models import build_vlm, static_decoding
from prismatic.models.action_heads import ActionSpec, tokens
from prismatic.models.compile_scope import COMPILE_SCOPES
from prismatic.models.decoding import DecodeOptions, greedy_decode
from prismatic.models.materialize import VLMArchitecture, build_vlm_from_spec
from prismatic.models.registry import get_base_vlm_spec

ACTION_IDS = range(768, 1024)


@pytest.fixture(scope="module")
def model(make_batch):
    """The tiny fused-backbone VLM, two prompts of different lengths (BOS first) and their images."""
    torch.manual_seed(0)
    vlm = build_vlm("tiny-dinosiglip+tiny-llama").eval()
    vlm.attach_action_modules(ActionSpec(action_dim=7))
    batch = make_batch(vlm)
    prompts = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]
    assert len(prompts[0]) != len(prompts[1])
    return vlm, prompts, batch["pixel_values"], vlm.llm_backbone.tokenizer.pad_token_id


def _forget(vlm) -> None:
    """No decoders, compiled functions or compile failure kept on the model, nor dynamo's graphs of the blocks'
    code (shared by every model in the process): the next call starts afresh."""
    torch._dynamo.reset()
    for name in (
        "_static_decoders",
        "_static_compiled",
        "_static_compiled_blocks",
        static_decoding.COMPILE_FAILED,
    ):
        vlm.__dict__.pop(name, None)


@pytest.fixture
def step_only(monkeypatch: pytest.MonkeyPatch, model) -> None:
    """Compile the decode step only (see the module docstring), on a model with nothing kept."""
    monkeypatch.setattr(static_decoding, "COMPILED", ("step",))
    _forget(model[0])


def _decode(model, batch: int, allowed: range | None, prompts: list[list[int]] | None = None, **options):
    """Decode the first `batch` prompts (or `prompts`, with the fixture's images in turn) with `DecodeOptions(**options)`."""
    vlm, fixture_prompts, pixels, pad_id = model
    prompts = fixture_prompts[:batch] if prompts is None else prompts
    rows = torch.arange(len(prompts)) % len(fixture_prompts)  # the fixture's images, in turn
    return greedy_decode(
        vlm,
        prompts,
        {key: value[rows] for key, value in pixels.items()},
        7,
        pad_id=pad_id,
        allowed_ids=allowed,
        options=DecodeOptions(**options),
    )


@pytest.mark.parametrize("scope", COMPILE_SCOPES)
@pytest.mark.parametrize(
    ("batch", "allowed"),
    [(1, ACTION_IDS), (2, None)],
    ids=["one-constrained", "batch-unconstrained"],
)
def test_compiled_step_ids_equal_the_dynamic_cache(
    model, step_only, batch: int, allowed: range | None, scope: str
) -> None:
    dynamic = _decode(model, batch, allowed, static_cache=False)
    graphs = counters["stats"]["unique_graphs"]
    compiled = _decode(model, batch, allowed, static_cache=True, compile_steps=True, compile_scope=scope)
    new = counters["stats"]["unique_graphs"] - graphs
    # Whole: the step in one graph (fullgraph: no graph break). Layers: the decoder layer's graph (at most one
    # more, with its first layer's index fixed: dynamo's choice), one for both layers. No recompile on later steps.
    assert new == 1 if scope == "whole" else new in (1, 2)
    assert static_decoding.COMPILE_FAILED not in model[0].__dict__
    assert torch.equal(compiled.token_ids, dynamic.token_ids)
    torch.testing.assert_close(compiled.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)
    again = _decode(model, batch, allowed, static_cache=True, compile_steps=True, compile_scope=scope)
    assert counters["stats"]["unique_graphs"] == graphs + new  # every step compiled now
    assert torch.equal(again.token_ids, dynamic.token_ids)
    torch.testing.assert_close(again.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("scope", COMPILE_SCOPES)
def test_one_compiled_step_serves_every_later_shape(model, step_only, scope: str) -> None:
    """Batch size and prompt and cache lengths are symbols in the compiled step's graphs: after one compile for a
    single request and one for a batch, new batch sizes and prompt lengths (other `TEXT_BUCKET`s and
    `CACHE_BUCKET`s) compile nothing, and every shape chooses the dynamic cache's ids."""
    prompts = model[1]
    longer = prompts[0] + prompts[0][1:] + prompts[0][1:]  # text and cache buckets past the fixture's prompts
    longest = longer + prompts[0][1:] + prompts[0][1:]
    shapes = [
        [prompts[0]],  # one request: compiled (batch size 1 is specialised)
        [longer[:5]],  # one request, another prompt length: no compile
        prompts,  # a batch: compiled again, once
        [longest, prompts[1], longer[:9]],  # another batch size, text and cache lengths: no compile
        [prompts[1]] * 5,
        [longer],
    ]
    new_graphs, seen = [], []
    for rows in shapes:
        dynamic = _decode(model, len(rows), ACTION_IDS, prompts=rows, static_cache=False)
        graphs = counters["stats"]["unique_graphs"]
        compiled = _decode(
            model,
            len(rows),
            ACTION_IDS,
            prompts=rows,
            static_cache=True,
            compile_steps=True,
            compile_scope=scope,
        )
        new_graphs.append(counters["stats"]["unique_graphs"] - graphs)
        seen.append(next(reversed(model[0].__dict__["_static_decoders"]))[0])  # (batch, text, prompt, cache)
        assert torch.equal(compiled.token_ids, dynamic.token_ids)
        torch.testing.assert_close(compiled.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)
    assert len(set(seen)) == len(shapes), seen  # every row a shape of its own
    assert len({shape[1] for shape in seen}) >= 3 and len({shape[3] for shape in seen}) >= 3, seen
    if scope == "whole":
        assert new_graphs == [1, 0, 1, 0, 0, 0]
    else:  # a layer's graph (and at most one more: see above) for one request, the same for larger batches
        assert new_graphs[0] in (1, 2) and new_graphs[2] in (1, 2), new_graphs
        assert new_graphs[1] == new_graphs[3] == new_graphs[4] == new_graphs[5] == 0, new_graphs
    assert static_decoding.COMPILE_FAILED not in model[0].__dict__


def test_compiled_layers_share_their_graphs_at_any_depth(model, step_only) -> None:
    """Compiled by layers, every decoder layer runs one graph whatever the model's depth: with eight layers the
    step compiles what it does with two (not a graph per layer: at 7B that was 32, past dynamo's limit of 8)."""
    spec = get_base_vlm_spec("tiny-dinosiglip+tiny-llama")
    config = model[0].llm_backbone.llm.config.to_dict()
    config.update(num_hidden_layers=8, layer_types=None)
    torch.manual_seed(0)
    deep = build_vlm_from_spec(
        VLMArchitecture(
            "tiny-dinosiglip+tiny-llama", spec, llm_config=type(model[0].llm_backbone.llm.config)(**config)
        ),
        pretrained_vision=False,
        pretrained_llm=False,
    ).eval()
    deep.attach_action_modules(ActionSpec(action_dim=7))
    assert len(deep.llm_backbone.get_layers()) == 8
    deep_model = (deep, *model[1:])
    dynamic = _decode(deep_model, 2, ACTION_IDS, static_cache=False)
    graphs = counters["stats"]["unique_graphs"]
    compiled = _decode(deep_model, 2, ACTION_IDS, static_cache=True, compile_steps=True)
    assert counters["stats"]["unique_graphs"] - graphs in (1, 2)
    assert static_decoding.COMPILE_FAILED not in deep.__dict__
    assert torch.equal(compiled.token_ids, dynamic.token_ids)
    torch.testing.assert_close(compiled.logprobs, dynamic.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("scope", "options"),
    [
        ("layers", {"fullgraph": True}),
        ("whole", {"fullgraph": True, "isolate_recompiles": True}),
    ],
)
def test_a_compile_failure_falls_back_with_one_warning(
    model, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, scope: str, options: dict
) -> None:
    _forget(model[0])
    attempts = []

    def failing_compile(fn, **options):
        def compiled(*args):
            attempts.append(options)
            raise torch._dynamo.exc.InternalTorchDynamoError("no C++ compiler here")

        return compiled

    monkeypatch.setattr(torch, "compile", failing_compile)
    with caplog.at_level(logging.WARNING, logger=static_decoding.__name__):
        one = _decode(model, 1, ACTION_IDS, static_cache=True, compile_steps=True, compile_scope=scope)
        batch = _decode(
            model, 2, None, static_cache=True, compile_steps=True, compile_scope=scope
        )  # no retry
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no C++ compiler here" in warnings[0].getMessage()
    if not static_decoding._COMPILE_ISOLATES:  # torch < 2.14
        options.pop("isolate_recompiles", None)
    assert attempts == [options]
    assert torch.equal(one.token_ids, _decode(model, 1, ACTION_IDS, static_cache=False).token_ids)
    assert torch.equal(batch.token_ids, _decode(model, 2, None, static_cache=False).token_ids)


def test_policy_option_reaches_greedy_decode(model, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = VLAPolicy(model[0], None, "tiny", torch.device("cpu"), torch.float32)
    assert policy.compile_decoding is False
    assert policy.compile_scope == "layers"
    seen = []

    def recording_decode(*args, options: DecodeOptions, **kwargs):
        seen.append((options.compile_steps, options.compile_scope))
        return greedy_decode(*args, options=replace(options, compile_steps=False), **kwargs)

    monkeypatch.setattr(tokens, "greedy_decode", recording_decode)
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    policy.decode_batch([image], ["push"])
    policy.compile_decoding = True
    policy.decode_batch([image], ["push"])
    policy.compile_scope = "whole"
    policy.decode_batch([image], ["push"])
    assert seen == [(False, "layers"), (True, "layers"), (True, "whole")]


def test_an_unknown_compile_scope_names_the_choices(model) -> None:
    with pytest.raises(ValueError, match="compile_scope 'blocks' is not one of layers, whole"):
        _decode(model, 1, ACTION_IDS, static_cache=True, compile_steps=True, compile_scope="blocks")


@pytest.mark.parametrize(("script", "name"), [("serve", "ServeConfig"), ("eval_libero", "EvalLiberoConfig")])
def test_compile_decoding_flag_parses(script: str, name: str, tmp_path: Path) -> None:
    from prismatic.util.cli import parse_config

    config = getattr(import_script(script), name)
    default = parse_config(config, ["--checkpoint", str(tmp_path)])
    assert (default.compile_decoding, default.compile_scope) == (False, "layers")
    assert (
        parse_config(config, ["--checkpoint", str(tmp_path), "--compile_decoding"]).compile_decoding is True
    )
    whole = parse_config(
        config, ["--checkpoint", str(tmp_path), "--compile_decoding", "true", "--compile_scope", "whole"]
    )
    assert (whole.compile_decoding, whole.compile_scope) == (True, "whole")


def test_scripts_hand_the_compile_flags_to_the_policy(
    model, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """`serve.py` and `eval_libero.py` decode with the scope they were given, not the policy's default."""
    import prismatic.inference
    from prismatic.inference import server
    from prismatic.util.cli import parse_config

    loaded = []

    def load(*args, **kwargs) -> VLAPolicy:
        loaded.append(VLAPolicy(model[0], None, "tiny", torch.device("cpu"), torch.float32))
        return loaded[-1]

    monkeypatch.setattr(prismatic.inference, "load_policy", load)
    flags = ["--checkpoint", str(tmp_path), "--compile_decoding", "true", "--compile_scope", "whole"]
    eval_libero = import_script("eval_libero")
    eval_libero.open_source(parse_config(eval_libero.EvalLiberoConfig, flags))

    serve = import_script("serve")
    started = []
    monkeypatch.setattr(serve, "warm_up", lambda policy, batch_size: None)
    monkeypatch.setattr(server, "create_app", lambda policy, **kwargs: policy)
    monkeypatch.setattr("uvicorn.Server.run", lambda self, sockets: started.append(self.config.app))
    serve.serve(parse_config(serve.ServeConfig, [*flags, "--port", str(free_port())]))
    assert started == [loaded[1]]
    assert [(p.compile_decoding, p.compile_scope) for p in loaded] == [(True, "whole")] * 2


@pytest.mark.parametrize(("max_batch_size", "expected"), [(4, [4, 1]), (1, [1])])
def test_server_warm_up_decodes_a_full_batch_then_one_request(
    model, monkeypatch: pytest.MonkeyPatch, max_batch_size: int, expected: list[int]
) -> None:
    """`serve.py` warms up both shapes `--compile_decoding` compiles for (a batch, one request), so no request
    waits for the compiler; the batch first, so a size that does not fit fails at start-up."""
    from prismatic.inference import server

    serve = import_script("serve")
    sizes = []
    monkeypatch.setattr(server, "predict_batch", lambda policy, requests: sizes.append(len(requests)))
    serve.warm_up(VLAPolicy(model[0], None, "tiny", torch.device("cpu"), torch.float32), max_batch_size)
    assert sizes == expected
