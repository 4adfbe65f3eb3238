"""Fixtures of the data tests: tiny synthetic Open-X datasets with real raw feature specs, built once."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def open_x_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data_root_dir holding the eight synthetic datasets of `oxe_synthetic.SPECS`."""
    from oxe_synthetic import build_synthetic_open_x

    return build_synthetic_open_x(tmp_path_factory.mktemp("open_x"))
