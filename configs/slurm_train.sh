#!/usr/bin/env bash
# Multi-node training under SLURM: one torchrun per node, c10d rendezvous on the first node, requeued on
# preemption. Submit with `sbatch configs/slurm_train.sh`; edit the #SBATCH lines and the variables below.
#SBATCH --job-name=vla-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:TERM@180
#SBATCH --output=slurm-%j.out
set -euo pipefail

VLA_TYPE=${VLA_TYPE:-prism-dinosiglip-224px+mx-oxe-magic-soup-plus}
DATA_ROOT=${DATA_ROOT:-/shared/open-x-embodiment}
RUN_ROOT=${RUN_ROOT:-/shared/runs}
RUN_ID=${RUN_ID:-${VLA_TYPE}-${SLURM_JOB_ID}}

# Continue the run when it already has a checkpoint (a requeued job); start it otherwise.
RESUME=()
if [[ -f "${RUN_ROOT}/${RUN_ID}/checkpoints/latest" ]]; then RESUME=(--resume); fi

MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# The interface the nodes reach each other on, for NCCL (training) and gloo (barriers, preemption flag, background
# saves); `ip -br addr` on a compute node lists them. Unset, gloo may pick one the other nodes cannot reach.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-ib0}

# SIGTERM (preemption, or --signal 180 s before the time limit) reaches the batch shell: pass it to every torchrun,
# whose workers save a checkpoint and exit 143; then requeue so the next allocation resumes.
trap 'scancel --signal=TERM --full "$SLURM_JOB_ID"; wait; scontrol requeue "$SLURM_JOB_ID"' TERM

srun --kill-on-bad-exit=1 torchrun \
    --nnodes "$SLURM_JOB_NUM_NODES" --nproc-per-node 8 \
    --rdzv_backend c10d --rdzv_endpoint "${MASTER_ADDR}:29500" --rdzv_id "$SLURM_JOB_ID" \
    vla_scripts/train.py --vla.type "$VLA_TYPE" --data_root_dir "$DATA_ROOT" --run_root_dir "$RUN_ROOT" \
    --run_id "$RUN_ID" --checkpoint.keep_last 3 "${RESUME[@]}" &
wait
