# The README's two commands: `make demo` (a tiny policy learns Meta-World tasks on CPU, shown in closed loop) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

DATA_ROOT ?= data/toy
RUN_ROOT  ?= runs
NPROC     ?= 2
VLA       ?= tiny+mx-toy

.PHONY: install demo demo-toy test test-learning check format clean

# Fresh venv + project (editable) + test tools. torch/torchvision are pinned in pyproject.toml.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,sim,sim-assets]' && $(BIN)/pip install --quiet --disable-pip-version-check --no-deps hf-libero==0.1.4
	touch $(STAMP)

install: $(STAMP)

# A policy that learns, shown in closed loop (README's first command): Meta-World's scripted experts give DEMO_EPISODES
# demonstrations of each of DEMO_TASKS (kept in DEMO_DATA: a second run reuses them), the tiny VLA DEMO_VLA trains on them
# under torchrun on CPU (NPROC processes), then it is rolled out in the simulator and the success table printed. W&B is not
# used (--trackers jsonl); the run lands in $(RUN_ROOT)/demo, its evaluation in $(RUN_ROOT)/demo/eval_metaworld/MT50.
DEMO_DATA     ?= data/metaworld_demo
DEMO_TASKS    ?= button-press-topdown-v3,drawer-open-v3
DEMO_EPISODES ?= 40
DEMO_TRIALS   ?= 10
DEMO_VLA      ?= tiny+metaworld
DEMO_VIEW      = --resolution 64 --shadows false
demo: $(STAMP)
	$(BIN)/python vla_scripts/collect_demos.py --benchmark metaworld --task_suite MT50 --tasks $(DEMO_TASKS) \
		--episodes_per_task $(DEMO_EPISODES) $(DEMO_VIEW) --num_workers $(NPROC) --data_root_dir $(DEMO_DATA)
	rm -rf $(RUN_ROOT)/demo
	$(BIN)/torchrun --standalone --nnodes 1 --nproc-per-node $(NPROC) vla_scripts/train.py \
		--vla.type $(DEMO_VLA) --vla.expected_world_size $(NPROC) --vla.per_device_batch_size $$((32 / $(NPROC))) \
		--plugins $(DEMO_DATA)/metaworld_mt50/metaworld_mt50_dataset.py --data_root_dir $(DEMO_DATA) \
		--run_root_dir $(RUN_ROOT) --run_id demo --trackers jsonl
	$(BIN)/python vla_scripts/eval_sim.py --benchmark metaworld --checkpoint $(RUN_ROOT)/demo --task_suite MT50 \
		--tasks $(DEMO_TASKS) --num_trials_per_task $(DEMO_TRIALS) --num_envs $(NPROC) $(DEMO_VIEW)

# The toy RLDS mixture and the tiny VLA trained on it for 300 steps (first vs last loss and action accuracy): the
# training path alone, in under a minute.
demo-toy: $(STAMP)
	$(BIN)/python vla_scripts/build_toy_dataset.py --data_root_dir $(DATA_ROOT)
	rm -rf $(RUN_ROOT)/demo-toy
	$(BIN)/torchrun --standalone --nnodes 1 --nproc-per-node $(NPROC) \
		vla_scripts/train.py --vla.type $(VLA) --data_root_dir $(DATA_ROOT) --run_root_dir $(RUN_ROOT) --run_id demo-toy \
		--trackers jsonl

# Two pytest-xdist workers, one thread each (a module stays on one worker; the longest first, tests/conftest.py): CI
# has 2 cores.
# `make test`: every CPU test but the closed-loop learning ones (marker `learning`), which `make test-learning` runs
# on its own (scripted demonstrations, a tiny policy trained on them, episodes in Meta-World: minutes); CI runs both.
test: $(STAMP)
	OMP_NUM_THREADS=1 WANDB_MODE=offline WANDB_SILENT=true $(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not learning"

test-learning: $(STAMP)
	OMP_NUM_THREADS=1 WANDB_MODE=offline WANDB_SILENT=true $(BIN)/pytest -q -m learning

# The GPU suite (tests/gpu, marker `gpu`; `make test` skips it without CUDA): NCCL, FSDP2 + bf16 + accumulation vs
# CPU, CPU offload, async DCP of CUDA tensors, DDP + autocast, validation under CUDA graphs, the policy and server in
# bf16, 2 ranks when there are 2 GPUs. On a GPU machine with torch but no venv: `make test-gpu PY=python3` (installs
# nothing). Each test's name prints as it starts and ends, and one still running after 4 min has every thread's stack
# printed (the suite compiles the tiny model several times on CUDA; benchmarks/results/ has its measured run times).
PY ?= $(BIN)/python
.PHONY: test-gpu
test-gpu: $(if $(filter $(BIN)/python,$(PY)),$(STAMP))
	$(PY) -m pytest -v -m gpu tests/gpu --durations=0 -o faulthandler_timeout=240

check: $(STAMP)
	$(BIN)/ruff check prismatic vla_scripts tests benchmarks
	$(BIN)/ruff format --check prismatic vla_scripts tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format prismatic vla_scripts tests benchmarks
	$(BIN)/ruff check --fix prismatic vla_scripts tests benchmarks

clean:
	rm -rf $(VENV) $(RUN_ROOT)/demo $(RUN_ROOT)/demo-toy .pytest_cache

# Data-path benchmark: frames/s as collated torch batches (16 x 224px) and peak RSS. Defaults to the toy mixture
# in $(DATA_ROOT) (built if missing); e.g. `make bench-data DATA_ROOT=/data/oxe MIX=bridge`, or Bridge-like
# 256px JPEG data: `make bench-data BENCH_ARGS="--bridge_like data/bench_bridge"`.
MIX        ?= toy
BENCH_ARGS ?=
.PHONY: bench-data
bench-data: $(STAMP)
	$(BIN)/python benchmarks/bench_data.py --data_root_dir $(DATA_ROOT) --data_mix $(MIX) $(BENCH_ARGS)

# Training-step throughput of the tiny preset under torchrun (samples/s, ms/step), on the toy mixture.
.PHONY: bench bench-train
bench-train: $(STAMP)
	$(BIN)/python benchmarks/bench_train.py --vla $(VLA) --nproc $(NPROC)
	$(BIN)/python benchmarks/bench_train.py --vla $(VLA) --nproc $(NPROC) --action_head l1-chunk --chunk_size 8

# Inference: predict_action latency, predict_action_batch actions/s at batch 1/8/32 (KV cache vs re-running), and
# the server's requests/s and latency at concurrency 1 and 16 (dynamic batching vs --max_batch_size 1).
.PHONY: bench-predict bench-serve
bench-predict: $(STAMP)
	$(BIN)/python benchmarks/bench_predict.py

bench-serve: $(STAMP)
	$(BIN)/python benchmarks/bench_serve.py

# Peak host memory of loading a sharded HF checkpoint: streamed vs all at once, FP32 vs bf16 (bench_load.py).
.PHONY: bench-load
bench-load: $(STAMP)
	$(BIN)/python benchmarks/bench_load.py

# Checkpoints at scale: sharded (DCP) vs single-file save / async stall / bytes / load, tiny and >= 300M params
# (bench_checkpoint.py); set-up memory per rank with meta-device start-up (bench_startup_memory.py); resuming the
# data stream after 10k vs 160k frames, snapshot vs skipping (bench_data_resume.py).
.PHONY: bench-checkpoint bench-startup bench-data-resume
bench-checkpoint: $(STAMP)
	$(BIN)/python benchmarks/bench_checkpoint.py
bench-startup: $(STAMP)
	$(BIN)/python benchmarks/bench_startup_memory.py
bench-data-resume: $(STAMP)
	$(BIN)/python vla_scripts/build_toy_dataset.py --data_root_dir $(DATA_ROOT)
	$(BIN)/python benchmarks/bench_data_resume.py --data_root_dir $(DATA_ROOT)

# GPU benchmark (benchmarks/bench_gpu.py): the registry's 7B and ~1B architectures (random weights, no download)
# through training's set-up and step, before / after the speed flags (ms/step, TFLOP/s, MFU, peak memory, host
# syncs), then predict_action latency and batch throughput on the 7B shape. On a machine with a GPU and torch but
# no venv: `make bench-gpu PY=python3`. `BENCH_GPU_ARGS="--device cpu"` runs the tiny ids (what a test keeps working).
BENCH_GPU_ARGS ?=
.PHONY: bench-gpu
bench-gpu: $(if $(filter $(BIN)/python,$(PY)),$(STAMP))
	$(PY) benchmarks/bench_gpu.py $(BENCH_GPU_ARGS)

# All benchmarks; each prints its figures.
bench: bench-data bench-train bench-predict bench-serve bench-load bench-checkpoint bench-startup bench-data-resume bench-gpu

# Mutation testing (cosmic-ray) of the modules that decide the numbers users depend on, against their fast tests,
# in a private copy of the tree (the checkout is never mutated). Prints per module and in total: mutants, killed,
# survived, judged equivalent (mutation/equivalent.toml), timeouts and the score. Slow (~31 min on 2 cores), not
# part of CI. Installs the `mutation` extra's tools only (not the project again). Some modules:
# `make mutation MUTATION_ARGS="--modules metrics lora"` (see mutation/README.md).
MUTATION_ARGS ?=
.PHONY: mutation
mutation: $(STAMP)
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['mutation'])" \
		| xargs $(BIN)/pip install --quiet --disable-pip-version-check
	$(BIN)/python mutation/run.py $(MUTATION_ARGS)
