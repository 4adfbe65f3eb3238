"""Meta-World's tasks as LeRobot evaluates them: the 50 task names in LeRobot's id order, the sentence each task is
prompted with, the difficulty groups and MT10, as suites; and the checks that turn a bad suite or task into one
clear message.

Read from huggingface/lerobot `src/lerobot/envs/metaworld.py` (`TASK_DESCRIPTIONS`, `TASK_NAME_TO_ID`,
`DIFFICULTY_TO_TASKS`, `TASK_POLICY_MAPPING`) and Meta-World's `MT10` (its `train_classes`). Plain tables: no
simulator, torch or TensorFlow is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable

from prismatic.util.errors import ConfigError, did_you_mean

# Task name -> the instruction (LeRobot's TASK_DESCRIPTIONS), in LeRobot's TASK_NAME_TO_ID order (= MT50 task ids).
TASK_DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "Pick up a nut and place it onto a peg",
    "basketball-v3": "Dunk the basketball into the basket",
    "bin-picking-v3": "Grasp the puck from one bin and place it into another bin",
    "box-close-v3": "Grasp the cover and close the box with it",
    "button-press-topdown-v3": "Press a button from the top",
    "button-press-topdown-wall-v3": "Bypass a wall and press a button from the top",
    "button-press-v3": "Press a button",
    "button-press-wall-v3": "Bypass a wall and press a button",
    "coffee-button-v3": "Push a button on the coffee machine",
    "coffee-pull-v3": "Pull a mug from a coffee machine",
    "coffee-push-v3": "Push a mug under a coffee machine",
    "dial-turn-v3": "Rotate a dial 180 degrees",
    "disassemble-v3": "Pick a nut out of a peg",
    "door-close-v3": "Close a door with a revolving joint",
    "door-lock-v3": "Lock the door by rotating the lock clockwise",
    "door-open-v3": "Open a door with a revolving joint",
    "door-unlock-v3": "Unlock the door by rotating the lock counter-clockwise",
    "drawer-close-v3": "Push and close a drawer",
    "drawer-open-v3": "Open a drawer",
    "faucet-close-v3": "Rotate the faucet clockwise",
    "faucet-open-v3": "Rotate the faucet counter-clockwise",
    "hammer-v3": "Hammer a screw on the wall",
    "hand-insert-v3": "Insert the gripper into a hole",
    "handle-press-side-v3": "Press a handle down sideways",
    "handle-press-v3": "Press a handle down",
    "handle-pull-side-v3": "Pull a handle up sideways",
    "handle-pull-v3": "Pull a handle up",
    "lever-pull-v3": "Pull a lever down 90 degrees",
    "peg-insert-side-v3": "Insert a peg sideways",
    "peg-unplug-side-v3": "Unplug a peg sideways",
    "pick-out-of-hole-v3": "Pick up a puck from a hole",
    "pick-place-v3": "Pick and place a puck to a goal",
    "pick-place-wall-v3": "Pick a puck, bypass a wall and place the puck",
    "plate-slide-back-side-v3": "Get a plate from the cabinet sideways",
    "plate-slide-back-v3": "Get a plate from the cabinet",
    "plate-slide-side-v3": "Slide a plate into a cabinet sideways",
    "plate-slide-v3": "Slide a plate into a cabinet",
    "push-back-v3": "Push the puck to a goal",
    "push-v3": "Push the puck to a goal",
    "push-wall-v3": "Bypass a wall and push a puck to a goal",
    "reach-v3": "Reach a goal position",
    "reach-wall-v3": "Bypass a wall and reach a goal",
    "shelf-place-v3": "Pick and place a puck onto a shelf",
    "soccer-v3": "Kick a soccer into the goal",
    "stick-pull-v3": "Grasp a stick and pull a box with the stick",
    "stick-push-v3": "Grasp a stick and push a box using the stick",
    "sweep-into-v3": "Sweep a puck into a hole",
    "sweep-v3": "Sweep a puck off the table",
    "window-open-v3": "Push and open a window",
    "window-close-v3": "Push and close a window",
}
MT50_TASKS: tuple[str, ...] = tuple(TASK_DESCRIPTIONS)

# LeRobot's DIFFICULTY_TO_TASKS; a group's task ids are positions in these lists (LeRobot enumerates them).
DIFFICULTY_TO_TASKS: dict[str, tuple[str, ...]] = {
    "easy": (
        "button-press-v3",
        "button-press-topdown-v3",
        "button-press-topdown-wall-v3",
        "button-press-wall-v3",
        "coffee-button-v3",
        "dial-turn-v3",
        "door-close-v3",
        "door-lock-v3",
        "door-open-v3",
        "door-unlock-v3",
        "drawer-close-v3",
        "drawer-open-v3",
        "faucet-close-v3",
        "faucet-open-v3",
        "handle-press-v3",
        "handle-press-side-v3",
        "handle-pull-v3",
        "handle-pull-side-v3",
        "lever-pull-v3",
        "plate-slide-v3",
        "plate-slide-back-v3",
        "plate-slide-back-side-v3",
        "plate-slide-side-v3",
        "reach-v3",
        "reach-wall-v3",
        "window-close-v3",
        "window-open-v3",
        "peg-unplug-side-v3",
    ),
    "medium": (
        "basketball-v3",
        "bin-picking-v3",
        "box-close-v3",
        "coffee-pull-v3",
        "coffee-push-v3",
        "hammer-v3",
        "peg-insert-side-v3",
        "push-wall-v3",
        "soccer-v3",
        "sweep-v3",
        "sweep-into-v3",
    ),
    "hard": (
        "assembly-v3",
        "hand-insert-v3",
        "pick-out-of-hole-v3",
        "pick-place-v3",
        "push-v3",
        "push-back-v3",
    ),
    "very_hard": (
        "shelf-place-v3",
        "disassemble-v3",
        "stick-pull-v3",
        "stick-push-v3",
        "pick-place-wall-v3",
    ),
}

# Meta-World's MT10, in the order of `metaworld.MT10().train_classes`.
MT10_TASKS: tuple[str, ...] = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)

# Suite -> its tasks in task-id order (`--task_suite`).
SUITES: dict[str, tuple[str, ...]] = {"MT50": MT50_TASKS, "MT10": MT10_TASKS, **DIFFICULTY_TO_TASKS}

# The scripted expert of each task is `metaworld.policies.<class>`; the class is "Sawyer" + the task's CamelCase
# name + "V3Policy" (LeRobot's TASK_POLICY_MAPPING), with one exception.
_POLICY_EXCEPTIONS = {"peg-insert-side-v3": "SawyerPegInsertionSideV3Policy"}


def check_suite(suite: str) -> None:
    """Raises ConfigError naming the valid suites when `suite` is not one of them."""
    if suite not in SUITES:
        raise ConfigError(
            f"Unknown Meta-World task suite '{suite}'.{did_you_mean(suite, SUITES)} Valid choices: "
            f"{', '.join(SUITES)}."
        )


def suite_tasks(suite: str) -> list[str]:
    """The task names of `suite`, in task-id order."""
    check_suite(suite)
    return list(SUITES[suite])


def check_task_names(names: Iterable[str]) -> None:
    """Raises ConfigError (with a did-you-mean) for a name that is not one of the 50 Meta-World tasks."""
    for name in names:
        if name not in TASK_DESCRIPTIONS:
            raise ConfigError(
                f"Unknown Meta-World task '{name}'.{did_you_mean(name, MT50_TASKS)} Tasks are named as in "
                f"Meta-World and LeRobot, e.g. {', '.join(MT50_TASKS[:3])}, ... (suite MT50 lists all 50)."
            )


def task_name(suite: str, task_id: int) -> str:
    """The name of task `task_id` of `suite`.

    Raises:
        ConfigError: an unknown suite, or an id outside 0 .. count - 1.
    """
    names = suite_tasks(suite)
    if isinstance(task_id, bool) or task_id not in range(len(names)):
        raise ConfigError(
            f"Task id {task_id} is not in Meta-World suite '{suite}': it has {len(names)} tasks, valid ids are "
            f"0-{len(names) - 1}."
        )
    return names[task_id]


def expert_policy_name(name: str) -> str:
    """The class in `metaworld.policies` that solves task `name` (e.g. `SawyerReachV3Policy` for reach-v3)."""
    check_task_names([name])
    if name in _POLICY_EXCEPTIONS:
        return _POLICY_EXCEPTIONS[name]
    words = name.removesuffix("-v3").split("-")
    return "Sawyer" + "".join(word.capitalize() for word in words) + "V3Policy"
