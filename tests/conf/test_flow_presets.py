"""The tiny flow presets: the tiny OFT ones (same data, chunk, proprio, schedule and world size) with the flow head
and a flow expert of the tiny LLM's size, whose options reach the run's action spec and yield to a flag."""

from __future__ import annotations

import dataclasses

import pytest

from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import get_vla_config
from prismatic.util.cli import parse_config

TINY_EXPERT = {"width": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "num_steps": 10}
FLOW_OF = {"tiny-flow+mx-toy": "tiny-oft+mx-toy", "tiny-flow+metaworld": "tiny-oft+metaworld"}


@pytest.mark.parametrize("vla_id", sorted(FLOW_OF))
def test_a_tiny_flow_preset_is_its_oft_preset_with_the_flow_head(vla_id: str) -> None:
    preset, oft = (
        dataclasses.asdict(get_vla_config(vla_id)),
        dataclasses.asdict(get_vla_config(FLOW_OF[vla_id])),
    )
    differing = {k for k in preset if k != "vla_id" and preset[k] != oft[k]}
    assert differing == {"action_head", "head"}
    assert preset["action_head"] == "flow" and oft["action_head"] == "l1-chunk"
    assert preset["head"] == {
        **oft["head"],
        "flow": TINY_EXPERT,
    }  # the other heads' groups keep their defaults
    assert (preset["chunk_size"], preset["use_proprio"], preset["base_vlm"]) == (
        8,
        True,
        "tiny-vit+tiny-llama",
    )


@pytest.mark.parametrize("vla_id", sorted(FLOW_OF))
def test_the_preset_s_expert_reaches_the_action_spec_and_a_flag_overrides_one_option(vla_id: str) -> None:
    from prismatic.training.model_setup import action_spec

    stats = {"a": {"action": {"q01": [0.0] * 4}, "proprio": {"q01": [0.0] * 8}}}
    spec = action_spec(parse_config(TrainConfig, ["--vla.type", vla_id]).vla, stats)
    assert (spec.head, spec.chunk_size, spec.action_dim, spec.proprio_dim) == ("flow", 8, 4, 8)
    assert dict(spec.head_options) == TINY_EXPERT
    cfg = parse_config(TrainConfig, ["--vla.type", vla_id, "--vla.head.flow.num_steps", "3"])
    assert dict(action_spec(cfg.vla, stats).head_options) == {**TINY_EXPERT, "num_steps": 3}


def test_the_metaworld_flow_preset_reads_the_demos_collect_writes() -> None:
    assert get_vla_config("tiny-flow+metaworld").data_mix == "metaworld_mt50"
    assert get_vla_config("tiny-flow+mx-toy").data_mix == "toy"
