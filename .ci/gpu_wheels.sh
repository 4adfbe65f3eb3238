#!/usr/bin/env bash
# Wheels for a GPU machine that has Python 3.12, torch, transformers, timm and peft but cannot reach a package
# registry: what tests/gpu and benchmarks/bench_gpu.py import beyond those (draccus and its needs, jsonlines, and
# the server's stack for the bf16 server test, with the typing-extensions and anyio it was resolved with), at the
# versions `make install` resolves here. Downloads them into .whl/ (git-ignored); `.ci/gpu.sh` installs what .whl/
# holds. Run it where pip reaches PyPI; PYTHON_VERSION names the GPU machine's Python (default 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
WHEELS=(
    draccus==0.11.6 mergedeep==1.3.4 toml==0.10.2 typing-inspect==0.9.0
    jsonlines==4.0.0
    fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
    typing-inspection==0.4.5 annotated-doc==0.0.7 opentelemetry-api==1.45.2 uvicorn==0.54.0 json-numpy==2.1.1
    typing-extensions==4.16.0 anyio==4.16.0
)
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
rm -rf .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
du -sh .whl
