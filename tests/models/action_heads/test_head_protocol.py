"""The head extension point: what the VLM hands a head module (`HeadInputs`) and a head's own options.

Pinned with expectations built here: the action positions a module gathers, what the VLM passes through its forward
to the module (hidden states, masks, the head's training inputs), `--vla.head.<head>.*` from the flags to the spec,
the module and the run's identity (a changed option refuses to resume), and a config.yaml from before the group.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from prismatic.conf.train import TrainConfig
from prismatic.util.cli import config_flags, parse_config
from prismatic.util.errors import ConfigError

OFT = ["--vla.type", "tiny-oft+mx-toy"]
STATS = {
    "a": {"action": {"q01": [0.0] * 7}, "proprio": {"q01": [0.0] * 8}}
}  # widths only: 7 actions, 8 proprio


def test_action_hidden_gathers_each_row_s_action_positions_in_order() -> None:
    from prismatic.models.action_heads import HeadInputs

    hidden = torch.arange(2 * 6, dtype=torch.float32).view(2, 6, 1).expand(2, 6, 3)
    action_mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 0, 1, 1, 0]], dtype=torch.bool)
    inputs = HeadInputs(hidden, torch.ones(2, 6, dtype=torch.bool), action_mask, num_prefix_tokens=1)
    # Row 0's action positions are 2 and 3 (values 2, 3); row 1's are 1, 3, 4 (values 6 + 1, 6 + 3, 6 + 4).
    assert inputs.action_hidden(2)[..., 0].tolist() == [[2.0, 3.0], [7.0, 9.0]]
    assert inputs.action_hidden(3)[1, :, 0].tolist() == [7.0, 9.0, 10.0]


def test_the_l1_module_reads_its_chunk_from_the_action_positions() -> None:
    from prismatic.models.action_heads import HeadInputs
    from prismatic.models.action_heads.l1_chunk import L1ChunkMLP

    torch.manual_seed(0)
    chunk, dim, width = 2, 3, 4
    module = L1ChunkMLP(width, dim, chunk)
    hidden = torch.randn(1, 9, width)
    positions = [2, 3, 4, 5, 6, 7]  # after BOS and a 1-position prefix, 6 = chunk * dim slots, then padding
    action_mask = torch.zeros(1, 9, dtype=torch.bool)
    action_mask[0, positions] = True
    out = module(HeadInputs(hidden, torch.ones(1, 9, dtype=torch.bool), action_mask, num_prefix_tokens=1))
    # By hand: step k reads slots k * dim .. (k + 1) * dim - 1, concatenated.
    slots = hidden[0, positions].reshape(1, chunk, dim * width)
    assert out.actions.shape == (1, chunk, dim)
    assert torch.equal(out.actions, module.read_out(slots))


def test_the_vlm_hands_its_module_the_hidden_states_masks_and_the_head_s_inputs() -> None:
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec, HeadModule, HeadModuleOutput

    class Recorder(HeadModule):
        def forward(self, inputs):
            self.seen = inputs
            return HeadModuleOutput(actions=inputs.actions * 2)

    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama").eval()
    vlm.attach_action_modules(ActionSpec(head="l1-chunk", chunk_size=2, action_dim=3, proprio_dim=4))
    vlm.action_head = Recorder()
    _, height, width = vlm.vision_backbone.default_image_resolution
    input_ids = torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 0, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    action_mask = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    actions, proprio = torch.randn(2, 2, 3), torch.randn(2, 4)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        out = vlm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pixel_values=torch.randn(2, 3, height, width),
            proprio=proprio,
            action_mask=action_mask,
            actions=actions,
            generator=generator,
        )
    seen, prefix = vlm.action_head.seen, vlm.num_patches + 1
    assert prefix == vlm.num_prefix_tokens and seen.num_prefix_tokens == prefix
    assert seen.hidden_BSE.shape == (2, 5 + prefix, vlm.llm_backbone.embed_dim)
    # The LLM's positions: BOS, the prefix (always real, never actions), then text tokens 2..5.
    expected_mask = torch.cat(
        [attention_mask[:, :1], torch.ones(2, prefix, dtype=torch.bool), attention_mask[:, 1:]], 1
    )
    expected_actions = torch.cat(
        [action_mask[:, :1], torch.zeros(2, prefix, dtype=torch.bool), action_mask[:, 1:]], 1
    )
    assert torch.equal(seen.mask_BS, expected_mask) and torch.equal(seen.action_mask_BS, expected_actions)
    assert seen.actions is actions and seen.proprio is proprio and seen.generator is generator
    assert torch.equal(out.actions, actions * 2)


def test_a_head_option_goes_from_its_flag_to_the_spec_and_the_module() -> None:
    from prismatic.training.model_setup import action_spec

    assert "vla.head.l1_chunk.mlp_blocks" in {flag.name for flag in config_flags(TrainConfig)}
    cfg = parse_config(TrainConfig, [*OFT, "--vla.head.l1_chunk.mlp_blocks", "3"])
    assert cfg.vla.head_options() == {"mlp_blocks": 3}
    spec = action_spec(cfg.vla, STATS)
    assert spec.head_options == {"mlp_blocks": 3}
    assert spec.to_dict()["head_options"] == {"mlp_blocks": 3}

    from prismatic.models.action_heads.l1_chunk import L1ChunkActionHead

    assert len(L1ChunkActionHead.build_module(spec, 16).blocks) == 3
    # The defaults: OpenVLA-OFT's 2 blocks, and action_model.json as before the options existed.
    default = action_spec(parse_config(TrainConfig, OFT).vla, STATS)
    assert default.head_options == {"mlp_blocks": 2} and "head_options" not in default.to_dict()
    assert len(L1ChunkActionHead.build_module(default, 16).blocks) == 2
    # The tokens head has no options: nothing in its spec.
    assert action_spec(parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy"]).vla, STATS).head_options == {}


def test_a_spec_file_without_options_reads_as_the_defaults_and_a_bad_one_is_refused() -> None:
    from prismatic.models.action_heads import ActionSpec

    old = {"head": "l1-chunk", "chunk_size": 8, "action_dim": 7, "proprio_dim": 8, "num_images": 1}
    assert ActionSpec.from_dict(old) == ActionSpec(**old, head_options={"mlp_blocks": 2})
    with pytest.raises(ConfigError, match=r"no option\(s\) \['blocks'\]; its options: mlp_blocks"):
        ActionSpec.from_dict({**old, "head_options": {"blocks": 3}}, where="x.json")
    with pytest.raises(ConfigError, match=r"--vla.head.l1_chunk.mlp_blocks=0 is out of range"):
        ActionSpec.from_dict({**old, "head_options": {"mlp_blocks": 0}})
    with pytest.raises(ConfigError, match=r"--vla.head.l1_chunk.mlp_blocks=0 is out of range"):
        parse_config(TrainConfig, [*OFT, "--vla.head.l1_chunk.mlp_blocks", "0"])


def test_a_changed_head_option_refuses_to_resume() -> None:
    from prismatic.training.run_folder import check_resume_compatible, run_identity

    saved = run_identity(parse_config(TrainConfig, OFT))
    assert saved["head.l1_chunk.mlp_blocks"] == 2
    assert "head.l1_chunk.mlp_blocks" not in run_identity(
        parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy"])
    )
    current = run_identity(parse_config(TrainConfig, [*OFT, "--vla.head.l1_chunk.mlp_blocks", "3"]))
    with pytest.raises(ConfigError) as error:
        check_resume_compatible(saved, current, path=Path("ckpt"), allow_config_change=False)
    message = str(error.value)
    assert "with --vla.head.l1_chunk.mlp_blocks 3 (the checkpoint's run used 2)" in message
    assert "Pass --vla.head.l1_chunk.mlp_blocks 2 to continue it as it was" in message and "\n" not in message
    # A checkpoint from before head options has no such key: nothing to compare.
    older = {k: v for k, v in saved.items() if not k.startswith("head.")}
    assert check_resume_compatible(older, current, path=Path("c"), allow_config_change=False) == []


def test_a_config_yaml_from_before_the_head_group_loads_with_the_defaults(tmp_path: Path) -> None:
    from prismatic.training.run_folder import config_to_dict

    written = config_to_dict(parse_config(TrainConfig, OFT))
    assert written["vla"]["head"]["l1_chunk"] == {"mlp_blocks": 2}  # recorded in config.yaml
    del written["vla"]["head"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(written, sort_keys=False))
    cfg = parse_config(TrainConfig, ["--config_path", str(path)])
    assert cfg.vla.action_head == "l1-chunk" and cfg.vla.head_options() == {"mlp_blocks": 2}
    cfg = parse_config(TrainConfig, ["--config_path", str(path), "--vla.head.l1_chunk.mlp_blocks", "4"])
    assert cfg.vla.head_options() == {"mlp_blocks": 4}


def test_a_preset_sets_head_options_as_defaults_a_flag_overrides() -> None:
    from prismatic.models.action_heads.options import HeadOptions, preset_head_options

    assert preset_head_options("p", {}) is HeadOptions
    cls = preset_head_options("p", {"l1_chunk": {"mlp_blocks": 4}})
    assert issubclass(cls, HeadOptions) and cls().l1_chunk.mlp_blocks == 4
    assert dataclasses.asdict(cls())["l1_chunk"] == {"mlp_blocks": 4}  # what config.yaml records
    with pytest.raises(ValueError, match="head group 'l1'"):
        preset_head_options("p", {"l1": {"mlp_blocks": 4}})
    with pytest.raises(ValueError, match=r"unknown l1_chunk options \['blocks'\]"):
        preset_head_options("p", {"l1_chunk": {"blocks": 4}})
