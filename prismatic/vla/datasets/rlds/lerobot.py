"""Read a LeRobotDataset folder (codebase v2.1 or v3.0) one episode at a time, for `vla_scripts/convert_to_rlds.py`.

    source = open_lerobot("~/.cache/huggingface/lerobot/lerobot/pusht")
    for ref in source.episodes:
        episode = source.load_episode(ref)  # {"images": {...}, "state": ..., "action": ..., "instruction": ...}

Parquet is read with pyarrow and video decoded with PyAV; the `lerobot` package is not needed. The layouts, as
lerobot's own code reads and writes them (`lerobot/datasets/utils.py`, `dataset_metadata.py`,
`scripts/convert_dataset_v21_to_v30.py`):

v2.1: one parquet file per episode, one mp4 per camera per episode (`episode_chunk = episode_index // chunks_size`)
    meta/info.json          codebase_version "v2.1", fps, chunks_size, features, data_path, video_path
    meta/episodes.jsonl     {"episode_index": 0, "tasks": ["..."], "length": 266} per line
    meta/tasks.jsonl        {"task_index": 0, "task": "..."} per line
    data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet                 (info.json's data_path)
    videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4       (info.json's video_path)

v3.0: several episodes per parquet file and per mp4
    meta/info.json          codebase_version "v3.0", data_path "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                            video_path "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    meta/episodes/chunk-*/file-*.parquet    one row per episode: episode_index, tasks, length, data/chunk_index,
                            data/file_index, dataset_from_index, dataset_to_index, and per camera
                            videos/<key>/chunk_index, videos/<key>/file_index, videos/<key>/from_timestamp, .../to_timestamp
    meta/tasks.parquet      column task_index; the task text is the (pandas) index column "task"

Every data row is one frame: timestamp (seconds from the episode's start), frame_index, episode_index, index,
task_index, and the features of meta/info.json. A "video" feature's frame is the mp4 frame shown at the row's
timestamp (in v3.0 plus the episode's `from_timestamp` in the shared mp4), found as frame number
round(time * fps) from the decoded frames' presentation times; an "image" feature's frame is PNG/JPEG bytes in
the row ({bytes, path}); numeric features are lists of numbers.

Mapping onto the converter's episode dict: cameras = the features of dtype "video" / "image" (depth videos left
out; `cameras=` picks and orders them, the first is the primary camera) under the observation key
`camera_observation_key` gives them; `observation.state` -> state; `action` -> action; task_index -> the task
text, per step. Every problem (missing file or key, unknown version, a row or frame that is not there) is a
`ConfigError` naming the file and what it expected.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from prismatic.util.errors import ConfigError, did_you_mean

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
CAMERA_DTYPES = ("video", "image")
STATE_KEY = "observation.state"
ACTION_KEY = "action"
INFO_PATH = "meta/info.json"
V21_EPISODES_PATH, V21_TASKS_PATH = "meta/episodes.jsonl", "meta/tasks.jsonl"
V30_EPISODES_DIR, V30_TASKS_PATH = "meta/episodes", "meta/tasks.parquet"


@dataclass(frozen=True)
class EpisodeRef:
    """Where one episode's rows and frames are.

    Attributes:
        index: its episode_index.
        length: its number of frames as the metadata says (None when it does not say).
        data_file: the parquet file holding its rows.
        videos: camera key -> (mp4 file, the episode's start in it in seconds) for the "video" cameras.
    """

    index: int
    length: int | None
    data_file: Path
    videos: dict[str, tuple[Path, float]] = field(default_factory=dict)


def camera_observation_key(feature_key: str) -> str:
    """The RLDS observation key of a LeRobot camera feature: `observation.images.top` -> `top`,
    `observation.image` -> `image` (the part after `observation.` / `observation.images.`, `[A-Za-z0-9_]` only)."""
    short = re.sub(r"^observation\.(images\.)?", "", feature_key)
    short = re.sub(r"\W", "_", short).strip("_") or "image"
    return f"cam_{short}" if short[0].isdigit() else short


class LeRobotSource:
    """A LeRobotDataset folder opened for conversion: its metadata read and checked, its episodes listed.

    Attributes:
        root: the folder (holding meta/info.json).
        version: "v2.1" or "v3.0".
        fps: frames per second of the data (info.json's fps).
        cameras: the LeRobot camera feature keys converted, the primary camera first.
        observation_keys: camera key -> RLDS observation key.
        state_dim: width of `observation.state`, or None when the dataset has none.
        action_dim: width of `action`.
        action_names: the names info.json gives the action's numbers (flattened; empty when it gives none), what
            the converter reads the action's meaning from (joint names: joint positions).
        tasks: task_index -> task text.
        episodes: every episode, by episode_index.
    """

    def __init__(self, root: Path, cameras: Sequence[str] | None = None) -> None:
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise ConfigError(
                f"--lerobot_dir '{self.root}' does not exist or is not a folder. Pass the folder of a LeRobot "
                "dataset: the one holding meta/info.json, data/ and videos/ (e.g. "
                "~/.cache/huggingface/lerobot/<repo_id>)."
            )
        self.info_path = self.root / INFO_PATH
        self.info = self._read_info()
        self.version = self.info["codebase_version"]
        self.fps = float(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        self.cameras = self._pick_cameras(cameras)
        self.observation_keys = self._observation_keys()
        self.action_dim = self._vector_width(ACTION_KEY)
        self.action_names = _flat_names(self.features[ACTION_KEY].get("names"))
        self.state_dim = self._vector_width(STATE_KEY) if STATE_KEY in self.features else None
        self.tasks = self._read_tasks()
        self.episodes = self._read_v21_episodes() if self.version == "v2.1" else self._read_v30_episodes()
        if not self.episodes:
            raise ConfigError(f"LeRobot dataset '{self.root}' lists no episodes in its meta/ folder.")
        self._check_files_exist()

    # ------------------------------------------------------------------------------------------------------
    # Metadata
    # ------------------------------------------------------------------------------------------------------

    def _read_info(self) -> dict[str, Any]:
        if not self.info_path.is_file():
            raise ConfigError(
                f"'{self.root}' is not a LeRobot dataset folder: it has no {INFO_PATH}. Pass the folder that "
                "holds meta/info.json, data/ and videos/ (e.g. ~/.cache/huggingface/lerobot/<repo_id>, or a "
                "folder made by `huggingface-cli download --repo-type dataset <repo_id> --local-dir <folder>`)."
            )
        try:
            info = json.loads(self.info_path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"Cannot read '{self.info_path}' as JSON: {e}.") from e
        if not isinstance(info, dict):
            raise ConfigError(f"'{self.info_path}' must hold a JSON object, got {type(info).__name__}.")
        version = info.get("codebase_version")
        if version not in SUPPORTED_VERSIONS:
            raise ConfigError(
                f"'{self.info_path}' has codebase_version {json.dumps(version)}; this converter reads LeRobot "
                f"datasets of codebase_version {' or '.join(SUPPORTED_VERSIONS)}. Upgrade an older dataset with "
                "lerobot's own conversion scripts first (v2.0 -> v2.1, then if you like v2.1 -> v3.0 with `python "
                "-m lerobot.scripts.convert_dataset_v21_to_v30`); a newer version is not read yet."
            )
        for key, kind in (("fps", (int, float)), ("features", dict), ("data_path", str)):
            if not isinstance(info.get(key), kind) or isinstance(info.get(key), bool):
                raise ConfigError(
                    f"'{self.info_path}' has no valid '{key}' (got {json.dumps(info.get(key))}); a LeRobot "
                    f"{version} info.json holds fps (a number), features (an object) and data_path (a template)."
                )
        if info["fps"] <= 0:
            raise ConfigError(f"'{self.info_path}' has fps {info['fps']}; it must be positive.")
        return info

    def _pick_cameras(self, wanted: Sequence[str] | None) -> list[str]:
        available = [
            key
            for key, feature in self.features.items()
            if feature.get("dtype") in CAMERA_DTYPES and not _is_depth(feature)
        ]
        if wanted is None:
            if not available:
                raise ConfigError(
                    f"'{self.info_path}' has no camera feature (dtype 'video' or 'image', not a depth map): a VLA "
                    f"reads a camera image every step. Features: {', '.join(self.features) or 'none'}."
                )
            return available
        wanted = list(wanted)
        if not wanted:
            raise ConfigError(f"--lerobot_cameras names no camera; choose from: {', '.join(available)}.")
        for key in wanted:
            if key not in available:
                raise ConfigError(
                    f"--lerobot_cameras names '{key}', which is not an RGB camera feature of '{self.info_path}'."
                    f"{did_you_mean(key, available)} Valid choices: {', '.join(available) or 'none'}."
                )
        if len(set(wanted)) != len(wanted):
            raise ConfigError(f"--lerobot_cameras names a camera twice: {', '.join(wanted)}.")
        return wanted

    def _observation_keys(self) -> dict[str, str]:
        keys = {camera: camera_observation_key(camera) for camera in self.cameras}
        if len(set(keys.values())) != len(keys) or "state" in keys.values():
            # Short names collide (`observation.images.top` and `observation.top`): spell out each in full.
            keys = {camera: re.sub(r"\W", "_", camera) for camera in self.cameras}
        return keys

    def _vector_width(self, key: str) -> int:
        feature = self.features.get(key)
        if feature is None:
            raise ConfigError(
                f"'{self.info_path}' has no '{key}' feature (features: {', '.join(self.features)}): a VLA learns "
                "to predict the action of every step, so the dataset needs one."
            )
        shape = feature.get("shape")
        dtype = str(feature.get("dtype"))
        numeric = re.fullmatch(r"(float|int|uint)\d*|bool", dtype) is not None
        if not numeric or not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int):
            raise ConfigError(
                f"'{self.info_path}': feature '{key}' must be a vector of numbers (dtype float32 and a shape "
                f"like [7]), got dtype {json.dumps(feature.get('dtype'))} and shape {json.dumps(shape)}."
            )
        return shape[0]

    def _read_tasks(self) -> dict[int, str]:
        if self.version == "v2.1":
            path = self.root / V21_TASKS_PATH
            rows = _read_jsonl(path, what="the task list")
            return {
                int(row["task_index"]): str(row["task"]) for row in _require(rows, path, "task_index", "task")
            }
        path = self.root / V30_TASKS_PATH
        table = _read_parquet(path, what="the task list (columns task_index, task)")
        columns = table.column_names
        text_column = "task" if "task" in columns else "__index_level_0__"
        if "task_index" not in columns or text_column not in columns:
            raise ConfigError(
                f"'{path}' must have the columns task_index and task (the task text, written as the index), "
                f"it has: {', '.join(columns)}."
            )
        indices, texts = table.column("task_index").to_pylist(), table.column(text_column).to_pylist()
        return {int(i): str(t) for i, t in zip(indices, texts, strict=True)}

    def _format_path(self, template_key: str, **values: Any) -> Path:
        template = self.info.get(template_key)
        if not isinstance(template, str):
            raise ConfigError(
                f"'{self.info_path}' has no '{template_key}' template (got {json.dumps(template)}), which its "
                f"{'video' if template_key == 'video_path' else 'data'} features need."
            )
        try:
            return self.root / template.format(**values)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(
                f"'{self.info_path}': its {template_key} '{template}' cannot be filled for a {self.version} "
                f"dataset (it may use {', '.join('{' + k + '}' for k in values)}): {e!r}."
            ) from e

    def _video_cameras(self) -> list[str]:
        return [c for c in self.cameras if self.features[c]["dtype"] == "video"]

    def _read_v21_episodes(self) -> list[EpisodeRef]:
        path = self.root / V21_EPISODES_PATH
        rows = _require(_read_jsonl(path, what="the episode list"), path, "episode_index")
        chunks_size = int(self.info.get("chunks_size") or 1000)
        refs = []
        for row in sorted(rows, key=lambda r: int(r["episode_index"])):
            index = int(row["episode_index"])
            chunk = index // chunks_size
            videos = {
                camera: (
                    self._format_path(
                        "video_path", episode_chunk=chunk, video_key=camera, episode_index=index
                    ),
                    0.0,
                )
                for camera in self._video_cameras()
            }
            data_file = self._format_path("data_path", episode_chunk=chunk, episode_index=index)
            length = row.get("length")
            refs.append(EpisodeRef(index, None if length is None else int(length), data_file, videos))
        return refs

    def _read_v30_episodes(self) -> list[EpisodeRef]:
        folder = self.root / V30_EPISODES_DIR
        files = sorted(folder.glob("*/*.parquet"))
        if not files:
            raise ConfigError(
                f"LeRobot v3.0 dataset '{self.root}' has no episode metadata: expected parquet files "
                f"'{folder}/chunk-000/file-000.parquet', .... Download the dataset's meta/ folder in full."
            )
        needed = ["episode_index", "data/chunk_index", "data/file_index"]
        for camera in self._video_cameras():
            needed += [f"videos/{camera}/{k}" for k in ("chunk_index", "file_index", "from_timestamp")]
        refs = []
        for path in files:
            columns = pq.read_schema(path).names
            missing = [c for c in needed if c not in columns]
            if missing:
                raise ConfigError(
                    f"LeRobot v3.0 episode metadata '{path}' has no column(s) {', '.join(missing)} (it has: "
                    f"{', '.join(c for c in columns if not c.startswith('stats/'))})."
                )
            optional = [c for c in ("length", "dataset_from_index", "dataset_to_index") if c in columns]
            table = _read_parquet(path, what="episode metadata", columns=needed + optional)
            rows = table.to_pylist()
            for row in rows:
                index = int(row["episode_index"])
                length = row.get("length")
                if length is None and row.get("dataset_to_index") is not None:
                    length = int(row["dataset_to_index"]) - int(row["dataset_from_index"])
                data_file = self._format_path(
                    "data_path",
                    chunk_index=int(row["data/chunk_index"]),
                    file_index=int(row["data/file_index"]),
                )
                videos = {}
                for camera in self._video_cameras():
                    video_file = self._format_path(
                        "video_path",
                        video_key=camera,
                        chunk_index=int(row[f"videos/{camera}/chunk_index"]),
                        file_index=int(row[f"videos/{camera}/file_index"]),
                    )
                    videos[camera] = (video_file, float(row[f"videos/{camera}/from_timestamp"]))
                refs.append(EpisodeRef(index, None if length is None else int(length), data_file, videos))
        return sorted(refs, key=lambda ref: ref.index)

    def _check_files_exist(self) -> None:
        """Every referenced parquet / mp4 file is there (before a long conversion starts, not half-way)."""
        for ref in self.episodes:
            if not ref.data_file.is_file():
                raise ConfigError(
                    f"LeRobot dataset '{self.root}': the data file of episode {ref.index} is missing: "
                    f"'{ref.data_file}' (from data_path in meta/info.json). Download the dataset's data/ folder "
                    "in full."
                )
            for camera, (video, _) in ref.videos.items():
                if not video.is_file():
                    raise ConfigError(
                        f"LeRobot dataset '{self.root}': the video of camera '{camera}' for episode {ref.index} "
                        f"is missing: '{video}' (from video_path in meta/info.json). Download the dataset's "
                        "videos/ folder in full, or leave that camera out with --lerobot_cameras."
                    )

    # ------------------------------------------------------------------------------------------------------
    # Episodes
    # ------------------------------------------------------------------------------------------------------

    def describe(self, ref: EpisodeRef) -> str:
        """`episode 3 of the LeRobot dataset '<root>'`: how messages name an episode."""
        return f"episode {ref.index} of the LeRobot dataset '{self.root}'"

    def load_episode(self, ref: EpisodeRef) -> dict[str, Any]:
        """One episode -> {"images": {observation key: uint8[T,H,W,3]}, "state": float32[T,S] | None, "action":
        float32[T,A], "instruction": str, or one str per step when the task changes within the episode}.

        Raises:
            ConfigError (naming the file and the episode): rows or columns missing, a row count unlike the
                metadata's length, NaN / inf in action or state, an unknown task_index, a frame that cannot be
                decoded or is not in the video.
        """
        where = f"{self.describe(ref)} (rows in '{ref.data_file}')"
        image_cameras = [c for c in self.cameras if self.features[c]["dtype"] == "image"]
        columns = ["timestamp", "frame_index", "task_index", ACTION_KEY, *image_cameras]
        if self.state_dim is not None:
            columns.append(STATE_KEY)
        table = self._read_rows(ref, columns, where)
        num_steps = table.num_rows
        if num_steps == 0:
            raise ConfigError(f"{where}: the file has no rows of this episode (episode_index {ref.index}).")
        if ref.length is not None and num_steps != ref.length:
            raise ConfigError(
                f"{where}: {num_steps} rows, but the episode metadata says its length is {ref.length}. The "
                "dataset is incomplete or damaged: download it again."
            )
        order = np.argsort(
            np.asarray(table.column("frame_index").to_numpy(zero_copy_only=False)), kind="stable"
        )
        table = table.take(order)
        action = _vector_column(table, ACTION_KEY, self.action_dim, where)
        state = (
            _vector_column(table, STATE_KEY, self.state_dim, where) if self.state_dim is not None else None
        )
        task_indices = table.column("task_index").to_pylist()
        unknown = sorted({i for i in task_indices if i not in self.tasks}, key=str)
        if unknown:
            raise ConfigError(
                f"{where}: task_index {unknown[0]} is not in the dataset's task list "
                f"({V21_TASKS_PATH if self.version == 'v2.1' else V30_TASKS_PATH}, {len(self.tasks)} task(s))."
            )
        instructions = [self.tasks[i] for i in task_indices]
        instruction: str | list[str] = instructions[0] if len(set(instructions)) == 1 else instructions
        timestamps = np.asarray(table.column("timestamp").to_numpy(zero_copy_only=False), np.float64)
        images = {}
        for camera in self.cameras:
            if self.features[camera]["dtype"] == "video":
                video, start_s = ref.videos[camera]
                fps = float((self.features[camera].get("info") or {}).get("video.fps") or self.fps)
                what = f"camera '{camera}', {self.describe(ref)}"
                frames = decode_video_frames(video, start_s + timestamps, fps, what)
            else:
                frames = _decode_image_column(table, camera, self.root, where)
            images[self.observation_keys[camera]] = frames
        return {"images": images, "state": state, "action": action, "instruction": instruction}

    def _read_rows(self, ref: EpisodeRef, columns: list[str], where: str) -> Any:
        present = pq.read_schema(ref.data_file).names
        missing = [c for c in [*columns, "episode_index"] if c not in present]
        if missing:
            raise ConfigError(
                f"{where}: the file has no column(s) {', '.join(missing)} (it has: {', '.join(present)})."
            )
        # Only this episode's rows (v3.0 files hold many episodes): memory stays one episode.
        return _read_parquet(
            ref.data_file, what="episode data", columns=columns, filters=[("episode_index", "=", ref.index)]
        )


def _flat_names(names: Any) -> list[str]:
    """A feature's `names` as one list: lerobot writes a list, or {"motors": [...]} (ALOHA), or null."""
    if isinstance(names, Mapping):
        return [str(n) for value in names.values() for n in _flat_names(value)]
    if isinstance(names, list | tuple):
        return [n for value in names for n in _flat_names(value)]
    return [] if names is None else [str(names)]


def _is_depth(feature: dict[str, Any]) -> bool:
    """A depth-map video (v3.0 writes info.is_depth_map, v2.1 info."video.is_depth_map"): not an RGB camera."""
    info = feature.get("info") or {}
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map"))


def open_lerobot(root: Path, cameras: Sequence[str] | None = None) -> LeRobotSource:
    """Open the LeRobot dataset folder `root` (see `LeRobotSource`); `cameras` picks and orders its cameras."""
    return LeRobotSource(root, cameras)


# ==========================================================================================================
# Files
# ==========================================================================================================


def _read_jsonl(path: Path, *, what: str) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(
            f"LeRobot v2.1 dataset file '{path}' ({what}) is missing; download the meta/ folder."
        )
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"'{path}' line {number} is not JSON ({e}); the file is damaged.") from e
        if not isinstance(row, dict):
            raise ConfigError(f"'{path}' line {number} is not a JSON object.")
        rows.append(row)
    return rows


def _require(rows: list[dict[str, Any]], path: Path, *keys: str) -> list[dict[str, Any]]:
    for number, row in enumerate(rows, start=1):
        for key in keys:
            if key not in row:
                raise ConfigError(f"'{path}' entry {number} has no '{key}' (it has: {', '.join(row)}).")
    return rows


def _read_parquet(path: Path, *, what: str, columns: list[str] | None = None, filters: Any = None) -> Any:
    if not path.is_file():
        raise ConfigError(f"LeRobot dataset file '{path}' ({what}) is missing; download the dataset in full.")
    try:
        return pq.read_table(path, columns=columns, filters=filters)
    except (OSError, pa.ArrowException) as e:
        raise ConfigError(
            f"Cannot read '{path}' ({what}) as parquet: {e}. The file is damaged or truncated."
        ) from e


def _vector_column(table: Any, key: str, width: int, where: str) -> np.ndarray:
    """float32[T, width] from a column of fixed-width number lists (or plain numbers when width is 1)."""
    column = table.column(key).combine_chunks()
    if column.null_count:
        raise ConfigError(f"{where}: column '{key}' has empty (null) entries.")
    if (
        pa.types.is_list(column.type)
        or pa.types.is_large_list(column.type)
        or pa.types.is_fixed_size_list(column.type)
    ):
        lengths = set(pc.list_value_length(column).to_pylist())
        values = column.flatten()
        if lengths != {width} or values.null_count or not _is_number_type(values.type):
            raise ConfigError(
                f"{where}: column '{key}' must hold {width} numbers per row (meta/info.json gives its shape as "
                f"[{width}]), got lists of {sorted(lengths)} {values.type} values."
            )
        array = values.to_numpy(zero_copy_only=False).reshape(len(column), width)
    elif _is_number_type(column.type) and width == 1:
        array = column.to_numpy(zero_copy_only=False).reshape(len(column), 1)
    else:
        raise ConfigError(f"{where}: column '{key}' must hold lists of {width} numbers, got {column.type}.")
    array = np.asarray(array, np.float32)
    bad = ~np.isfinite(array)
    if bad.any():
        step, dim = (int(i) for i in np.argwhere(bad)[0])
        raise ConfigError(
            f"{where}: '{key}' holds NaN or inf (first at step {step}, dimension {dim}); fix or drop those steps."
        )
    return array


def _is_number_type(arrow_type: Any) -> bool:
    return (
        pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type)
    )


def _decode_image_column(table: Any, key: str, root: Path, where: str) -> np.ndarray:
    """uint8[T, H, W, 3] from an "image" feature's column: per row {bytes, path} (PNG / JPEG) or raw bytes."""
    frames = []
    for step, value in enumerate(table.column(key).to_pylist()):
        data = value.get("bytes") if isinstance(value, dict) else value
        if data is None and isinstance(value, dict) and value.get("path"):
            path = Path(value["path"])
            path = path if path.is_absolute() else root / path
            data = path.read_bytes() if path.is_file() else None
        if data is None:
            raise ConfigError(f"{where}: image '{key}' at step {step} has neither bytes nor a readable file.")
        try:
            with Image.open(io.BytesIO(data)) as image:
                frames.append(np.asarray(image.convert("RGB")))
        except (UnidentifiedImageError, OSError) as e:
            raise ConfigError(f"{where}: image '{key}' at step {step} cannot be decoded: {e}.") from e
    if len({frame.shape for frame in frames}) != 1:
        raise ConfigError(f"{where}: images of '{key}' differ in size within the episode.")
    return np.stack(frames)


def decode_video_frames(path: Path, times_s: np.ndarray, fps: float, what: str) -> np.ndarray:
    """uint8[T, H, W, 3] (RGB): for each time, the frame of `path` whose number round(pts_time * fps) is
    round(time * fps), i.e. the frame shown at that time.

    Decodes from the keyframe before the first time to the last time only (one episode of a shared v3.0 mp4),
    keeping just the frames asked for.

    Raises:
        ConfigError: the file cannot be decoded, or a frame asked for is not in it (naming `what` and the times).
    """
    wanted = np.rint(np.asarray(times_s, np.float64) * fps).astype(np.int64)
    needed = set(wanted.tolist())
    first, last = int(wanted.min()), int(wanted.max())
    found: dict[int, np.ndarray] = {}
    seen = (math.inf, -math.inf)  # the first and last frame numbers decoded
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ConfigError(f"Video '{path}' ({what}) has no video stream.")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            if first > 0:
                # Half a frame early, so that the keyframe at or before the first frame is where decoding starts.
                target = math.floor((first - 0.5) / fps / stream.time_base)
                container.seek(max(target, 0), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                number = round(float(frame.pts * stream.time_base) * fps)
                seen = (min(seen[0], number), max(seen[1], number))
                if number in needed and number not in found:
                    found[number] = frame.to_ndarray(format="rgb24")
                if number >= last:
                    break
    except av.error.FFmpegError as e:  # av.FFmpegError in newer PyAV, the same class
        raise ConfigError(
            f"Cannot decode video '{path}' ({what}): {e}. The file is damaged or truncated."
        ) from e
    missing = sorted(needed - set(found))
    if missing:
        frames_there = f"frames {seen[0]} to {seen[1]}" if seen[1] >= 0 else "no frames"
        raise ConfigError(
            f"Video '{path}' ({what}) has no frame at {missing[0] / fps:.4f} s (frame {missing[0]} at {fps:g} fps; "
            f"{len(missing)} frame(s) missing; decoded {frames_there} from there). The video is shorter than its "
            "rows, or the metadata's timestamps / from_timestamp do not match it: download the dataset again."
        )
    return np.stack([found[n] for n in wanted.tolist()])
