#!/usr/bin/env bash
# Multi-node training under SLURM: one torchrun per node, c10d rendezvous on the first node, requeued on
# preemption. Submit with `sbatch configs/slurm_train.sh`; edit the #SBATCH lines and the variables below.
#
# When to stop before the time limit (--signal below): the preemption checkpoint must be written before SLURM
# kills the job. At 7B (full fine-tuning) a checkpoint holds FP32 weights + two FP32 AdamW moments:
#   7.5e9 params x (4 + 4 + 4) B = 90 GB, written in parallel by all ranks (1.4 GB each at 64 ranks),
# so its time is set by the shared storage's aggregate write bandwidth. Assumed here: 0.5 GB/s (a loaded NFS or
# Lustre share; measure yours with fio/dd and scale): 90 GB / 0.5 GB/s = 180 s per checkpoint. At the signal a
# background (async) save may still be in flight, and the preemption save waits for it first:
#   finish the current step (<= 60 s) + in-flight save (180 s) + preemption save (180 s) + rename, `latest`,
#   keep_last deletes and margin (180 s) = 600 s  ->  --signal=B:TERM@600.
# torchrun gives its workers 30 s by default after it forwards a SIGTERM before it kills them: 30 s x 0.5 GB/s =
# 15 GB, a sixth of one checkpoint. So the batch shell alone gets the signal (B:) and the trap below signals the
# training workers directly, not torchrun; and torchrun's grace is raised to the same 600 s (--shutdown-timeout)
# for when it is signalled too. A preemption by the scheduler itself (not the time limit) signals every process
# at once and SIGKILLs after the partition's GraceTime: ask for GraceTime >= 600 s on preemptible partitions, or
# the run resumes from its last interval checkpoint.
#SBATCH --job-name=vla-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:TERM@600
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
# The interface the nodes reach each other on, for NCCL (training) and gloo (statistics barrier, background
# saves, the final export's barrier); `ip -br addr` on a compute node lists them. Unset, gloo may pick one the
# other nodes cannot reach.
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-ib0}

# SIGTERM (--signal 600 s before the time limit) reaches this batch shell. Pass it to the training workers on
# every node (torchrun starts them as `python -u vla_scripts/train.py`; the [t] keeps the pattern from matching
# this command line itself), which finish their step, save a checkpoint and exit 143; torchrun then ends. Then
# requeue so the next allocation resumes.
stop_workers() {
    srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
        pkill -TERM -f -- '-u vla_scripts/[t]rain.py' || true
    wait || true
    scontrol requeue "$SLURM_JOB_ID"
}
trap stop_workers TERM

srun --kill-on-bad-exit=1 torchrun \
    --nnodes "$SLURM_JOB_NUM_NODES" --nproc-per-node 8 --shutdown-timeout 600 \
    --rdzv_backend c10d --rdzv_endpoint "${MASTER_ADDR}:29500" --rdzv_id "$SLURM_JOB_ID" \
    vla_scripts/train.py --vla.type "$VLA_TYPE" --data_root_dir "$DATA_ROOT" --run_root_dir "$RUN_ROOT" \
    --run_id "$RUN_ID" --checkpoint.keep_last 3 "${RESUME[@]}" &
wait
