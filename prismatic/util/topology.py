"""Where this process sits in the job, read from torchrun's environment without importing torch.

The processes per node (`LOCAL_WORLD_SIZE`) decide the node count, hence FSDP's hybrid mesh (replicate across
nodes x shard within a node) and every per-node memory budget. torchrun always sets it; a launcher that does not
would silently turn a multi-node run into one flat mesh, so a multi-process job without it is refused.
"""

from __future__ import annotations

import os

from prismatic.util.errors import ConfigError


def world_size() -> int:
    """Processes in the job (`WORLD_SIZE`; 1 for a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_world_size(world: int) -> int:
    """Processes on this node (`LOCAL_WORLD_SIZE`).

    Raises:
        ConfigError: `world` > 1 and the launcher did not say how many processes share a node.
    """
    value = os.environ.get("LOCAL_WORLD_SIZE")
    if value is not None:
        return int(value)
    if world > 1:
        raise ConfigError(
            f"LOCAL_WORLD_SIZE is not set, but WORLD_SIZE is {world}: the processes per node decide the FSDP mesh "
            "(shard within a node, replicate across nodes), and guessing would silently flatten a multi-node run. "
            "Launch with torchrun (it sets it), or export LOCAL_WORLD_SIZE=<processes per node> in every process "
            "(under SLURM: $SLURM_NTASKS_PER_NODE)."
        )
    return 1


def num_nodes(world: int) -> int:
    """Nodes in the job: the world size over the processes per node (at least 1)."""
    return max(1, world // max(1, local_world_size(world)))
