#!/usr/bin/env bash
# Wheels for a GPU machine that has Python 3.12, torch, transformers, timm and peft but cannot reach a package
# registry: what tests/gpu and benchmarks/bench_gpu.py import beyond those (draccus and its needs, jsonlines, and
# the server's stack for the bf16 server test, with the typing-extensions and anyio it runs with), each at the
# version this checkout's venv holds (`make install` first), so the GPU runs what CI tests. Downloads them into
# .whl/ (git-ignored); `.ci/gpu.sh` installs what .whl/ holds. Run it where pip reaches PyPI; PYTHON_VERSION names
# the GPU machine's Python (default 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
NAMES=(
    draccus mergedeep toml typing-inspect jsonlines
    fastapi starlette pydantic pydantic-core annotated-types typing-inspection annotated-doc opentelemetry-api
    uvicorn json-numpy typing-extensions anyio
)
if [ ! -x .venv/bin/python ]; then
    echo "gpu_wheels.sh: no .venv here; run \`make install\` first (the wheels take its versions)" >&2
    exit 2
fi
mapfile -t WHEELS < <(.venv/bin/python -c '
import sys
from importlib.metadata import version
for name in sys.argv[1:]:
    print(f"{name}=={version(name)}")
' "${NAMES[@]}")
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
rm -rf .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
du -sh .whl
