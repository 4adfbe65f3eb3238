"""The preset tables of docs/libero.md and docs/metaworld.md list every registered LIBERO / Meta-World preset, and
each libero.md row says what its preset holds (head, chunk, cameras, proprio, LoRA, batch, learning rate, steps).
Torch-free: the registry and the markdown only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prismatic.conf.vla import get_vla_config, registered_vla_ids

REPO = Path(__file__).resolve().parents[2]
SUITES = ("spatial", "object", "goal", "10")


def table_rows(doc: str, header_start: str) -> list[list[str]]:
    """The cells of each row of the table whose header starts with `header_start`."""
    lines = (REPO / doc).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def presets_of(cell: str) -> list[str]:
    """The preset ids a first cell names: `name`, or `name_<suite>` for each LIBERO suite."""
    (name,) = re.findall(r"`([^`]+)`", cell)
    return [name.replace("<suite>", s) for s in SUITES] if "<suite>" in name else [name]


LIBERO_ROWS = table_rows("docs/libero.md", "| preset | recipe |")


def test_the_libero_table_lists_every_7b_libero_preset() -> None:
    listed = sorted(p for row in LIBERO_ROWS for p in presets_of(row[0]))
    expected = sorted(v for v in registered_vla_ids() if v.startswith("openvla-") and "+libero_" in v)
    assert listed == expected
    assert {"openvla-flow-7b+libero_goal", "openvla-fast-7b+libero_10"} <= set(listed)


@pytest.mark.parametrize("row", LIBERO_ROWS, ids=[row[0] for row in LIBERO_ROWS])
def test_each_libero_row_says_what_its_presets_hold(row: list[str]) -> None:
    _, _, head, images, proprio, lora, batch, lr, steps = row
    for vla_id in presets_of(row[0]):
        cfg = get_vla_config(vla_id)
        assert head.split(",")[0] == cfg.action_head
        if cfg.chunk_size > 1:
            assert f"{cfg.chunk_size} actions" in head
        assert int(images.split()[0]) == cfg.num_images
        assert proprio == ("yes" if cfg.use_proprio else "no")
        assert lora.startswith(f"r{cfg.lora_rank}," if cfg.use_lora else "none")
        world = cfg.expected_world_size
        assert batch == f"{cfg.global_batch_size} ({world} x {cfg.per_device_batch_size})"
        assert float(re.split(r"[ ,]", lr)[0]) == cfg.learning_rate
        assert steps == f"{cfg.max_steps // 1000}k"


def test_the_metaworld_table_lists_every_metaworld_preset() -> None:
    listed = sorted(
        p for row in table_rows("docs/metaworld.md", "| preset | what it is |") for p in presets_of(row[0])
    )
    expected = sorted(v for v in registered_vla_ids() if v.endswith(("+metaworld_mt50", "+metaworld")))
    assert listed == expected
    assert {"openvla-flow-7b+metaworld_mt50", "openvla-fast-7b+metaworld_mt50", "tiny-fast+metaworld"} <= set(
        listed
    )
