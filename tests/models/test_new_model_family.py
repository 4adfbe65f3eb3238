"""Adding a model family through the public path only (docs/adding_a_model.md): a plugin module registers a new
LLM family (Qwen2 architecture, its own prompt format), a new vision backbone (a DeiT ViT), a base VLM combining
them and a VLA preset; `train.py --plugins <module>` trains it for two steps. No registry source is edited."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from train_runs import free_port

REPO = Path(__file__).resolve().parents[2]

PLUGIN = textwrap.dedent(
    '''
    """Test plugin: a tiny Qwen2-architecture LLM family with its own chat format, and a tiny DeiT backbone."""

    from prismatic.conf.vla import register_vla
    from prismatic.models.backbones.llm.prompting import TemplatePromptBuilder
    from prismatic.models.backbones.llm.registry import LLMBackboneSpec, register_llm_backbone
    from prismatic.models.backbones.vision.registry import SingleViTSpec, ViTSpec, register_vision_backbone
    from prismatic.models.registry import BaseVLMSpec, register_base_vlm


    class RobotChatPromptBuilder(TemplatePromptBuilder):
        human_template = "<|user|>{message}<|robot|>"
        gpt_template = "{message}</s>"


    register_llm_backbone(
        "tiny-qwen2",
        LLMBackboneSpec(
            "qwen2",
            RobotChatPromptBuilder,
            model_type="qwen2",
            config={
                "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
            },
            tokenizer_source="tiny",
            max_length=256,
        ),
    )
    register_vision_backbone(
        "tiny-deit-64px",
        SingleViTSpec(ViTSpec("deit_tiny_patch16_224", 64, {"depth": 3}), has_pretrained_weights=False),
    )
    register_base_vlm("tiny-deit+tiny-qwen2", BaseVLMSpec("tiny-deit-64px", "tiny-qwen2", "gelu-mlp", "letterbox"))
    register_vla("tiny-deit-qwen2+mx-toy", "tiny+mx-toy", base_vlm="tiny-deit+tiny-qwen2")
    '''
)


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "my_model_family.py").write_text(PLUGIN)
    return folder


def test_registered_family_builds_with_its_prompt_format(monkeypatch, plugin_dir: Path) -> None:
    from prismatic.conf import vla as vla_module
    from prismatic.conf.vla import VLAConfig
    from prismatic.models import BASE_VLMS, LLM_BACKBONES, VISION_BACKBONES, build_vlm
    from prismatic.util.errors import ConfigError

    # Registries are restored after the test (other tests enumerate them).
    registries = (BASE_VLMS, LLM_BACKBONES, VISION_BACKBONES, vla_module._PRESETS, VLAConfig._choice_registry)
    saved = [dict(registry) for registry in registries]
    monkeypatch.syspath_prepend(str(plugin_dir))
    try:
        from prismatic.models.registry import import_plugins

        assert import_plugins(["--plugins", "my_model_family", "--x", "1"]) == ["--x", "1"]
        torch.manual_seed(0)
        vlm = build_vlm("tiny-deit+tiny-qwen2")
        assert type(vlm.llm_backbone.llm).__name__ == "Qwen2ForCausalLM"
        assert (vlm.num_patches, vlm.vision_backbone.embed_dim) == (16, 192)
        builder = vlm.llm_backbone.prompt_builder_fn("openvla")
        builder.add_turn("human", "push the can")
        assert builder.get_response_prefix() == "<|user|>push the can<|robot|>"
        with pytest.raises(ConfigError, match="already registered"):
            from prismatic.models.backbones.llm.registry import register_llm_backbone

            register_llm_backbone("tiny-qwen2", LLM_BACKBONES["tiny-qwen2"])
        with pytest.raises(ConfigError, match="Plugin module 'no_such_plugin'"):
            import_plugins(["--plugins=no_such_plugin"])
    finally:
        for registry, before in zip(registries, saved, strict=True):
            registry.clear()
            registry.update(before)
        sys.modules.pop("my_model_family", None)


def test_registered_family_trains_two_steps(plugin_dir: Path, toy_data_root: Path, tmp_path: Path) -> None:
    from prismatic.training.trackers import read_metrics

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
        "WANDB_MODE": "offline",
        "MASTER_PORT": str(free_port()),  # a group of one; concurrent runs must not share the default port
    }
    args = ["--plugins", "my_model_family", "--vla.type", "tiny-deit-qwen2+mx-toy", "--vla.max_steps", "2"]
    args += ["--vla.expected_world_size", "1", "--vla.global_batch_size", "2", "--trackers", "[jsonl]"]
    args += ["--vla.per_device_batch_size", "2"]
    args += ["--data_root_dir", str(toy_data_root), "--run_root_dir", str(tmp_path), "--run_id", "new-family"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "vla_scripts" / "train.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = read_metrics(tmp_path / "new-family")
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] == r["loss"] for r in records)
