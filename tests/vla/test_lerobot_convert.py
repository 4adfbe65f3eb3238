"""LeRobot datasets in: `convert_to_rlds.py --lerobot_dir` reads LeRobot v2.1 and v3.0 folders into RLDS.

The folders are built here the way lerobot writes them (parquet through pyarrow, mp4 through PyAV; v2.1 with one
file per episode and H.264 video, v3.0 with episodes sharing parquet and AV1 mp4 files at offsets, and an "image"
camera stored as PNG bytes in the rows). Every frame has its own colours, so the checks can tell frames, episodes,
cameras and the R / G / B channels apart. One tiny training run reads a conversion through its plugin file.
"""

from __future__ import annotations

import io
import json
import runpy
import shutil
from pathlib import Path
from types import ModuleType

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from scripts import import_script
from train_runs import run_train

from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds import configs, transforms
from prismatic.vla.datasets.rlds.lerobot import open_lerobot

FPS = 10
TASKS = ["pick up the red cube", "open the drawer", "push the button"]
TOP, WRIST = "observation.images.top", "observation.images.wrist"
SIZES = {TOP: (32, 32), WRIST: (32, 64)}  # (H, W); colour blocks aligned to JPEG's 16-pixel blocks
# Frames come back through two lossy steps: the mp4's yuv420p (RGB -> YUV -> RGB rounding: up to 3 levels at the
# lossless settings used here; PNG frames: none) and the RLDS JPEG (flat 8x8-aligned blocks keep their value to a
# level or two; both together measured at 3). The JPEG decoder interpolates its half-resolution chroma, which blends the two
# columns either side of the colour edge: `interior` leaves those out. Frames of one camera differ by >= 36 levels
# in a channel, so a tolerance of 6 still tells every frame, episode and channel order apart.
TOLERANCE = 6


def interior(images: np.ndarray) -> np.ndarray:
    """[..., H, W, 3] without the 2 columns either side of the left / right colour edge."""
    middle = images.shape[-2] // 2
    return np.concatenate([images[..., : middle - 2, :], images[..., middle + 2 :, :]], axis=-2)


# Per dataset version: episodes' lengths and per-frame task indices; action and state widths.
EPISODES = {
    "v2.1": [[0] * 5, [1] * 7, [0] * 6],
    "v3.0": [[0] * 6, [1, 1, 1, 2, 2, 2, 2], [2] * 5],  # episode 1 changes task half-way
}
ACTION_DIM = {"v2.1": 6, "v3.0": 7}
STATE_DIM = {"v2.1": 6, "v3.0": 5}


def frame(camera: str, episode: int, t: int) -> np.ndarray:
    """uint8[H, W, 3]: the left half one colour, the right half another, both unique to (camera, episode, t)."""
    height, width = SIZES[camera]
    red, green, blue = 16 + 36 * t, 40 + 60 * episode, 220 if camera == TOP else 120
    image = np.empty((height, width, 3), np.uint8)
    image[:, : width // 2] = (red, green, blue)
    image[:, width // 2 :] = (blue, 255 - red, green)
    return image


def vectors(version: str, episode: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(action, state) of one episode: float32, as lerobot stores them, so the conversion must keep every bit."""
    rng = np.random.default_rng(100 * episode + ACTION_DIM[version])
    action = rng.normal(size=(num_steps, ACTION_DIM[version])).astype(np.float32)
    state = rng.uniform(-1, 1, size=(num_steps, STATE_DIM[version])).astype(np.float32)
    return action, state


def encode_video(path: Path, frames: list[np.ndarray], codec: str) -> None:
    """An mp4 at FPS, frame k at k / FPS, as lerobot's encoder writes it (yuv420p), here at lossless settings."""
    options = {"qp": "0"} if codec == "libx264" else {"svtav1-params": "lossless=1", "g": "2"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS, options=options)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())


def video_duration(path: Path) -> float:
    """Seconds, as lerobot measures a part before concatenating it (`get_video_duration_in_s`)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return float(stream.duration * stream.time_base)


def concat_videos(parts: list[Path], out: Path) -> None:
    """lerobot's `concatenate_video_files`: ffmpeg's concat demuxer, packets copied into one mp4."""
    listing = out.parent / "parts.ffconcat"
    out.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text("ffconcat version 1.0\n" + "".join(f"file '{p.resolve()}'\n" for p in parts))
    with (
        av.open(str(listing), format="concat", options={"safe": "0"}) as source,
        av.open(str(out), "w") as sink,
    ):
        template = source.streams.video[0]
        stream = sink.add_stream_from_template(template=template, opaque=True)
        stream.time_base = template.time_base
        for packet in source.demux(template):
            if packet.dts is not None:
                packet.stream = stream
                sink.mux(packet)
    listing.unlink()


def rows(version: str, episode: int, first_index: int, image_camera: str | None = None) -> pa.Table:
    """One episode's rows as lerobot stores them (float32 lists, float32 timestamps, int64 indices)."""
    tasks = EPISODES[version][episode]
    num_steps = len(tasks)
    action, state = vectors(version, episode, num_steps)
    columns = {
        "action": pa.array(list(action), pa.list_(pa.float32())),
        "observation.state": pa.array(list(state), pa.list_(pa.float32())),
        "timestamp": pa.array(np.arange(num_steps, dtype=np.float32) / np.float32(FPS), pa.float32()),
        "frame_index": pa.array(np.arange(num_steps), pa.int64()),
        "episode_index": pa.array([episode] * num_steps, pa.int64()),
        "index": pa.array(np.arange(first_index, first_index + num_steps), pa.int64()),
        "task_index": pa.array(tasks, pa.int64()),
    }
    if image_camera is not None:
        pngs = []
        for t in range(num_steps):
            buffer = io.BytesIO()
            Image.fromarray(frame(image_camera, episode, t)).save(buffer, format="PNG")
            pngs.append({"bytes": buffer.getvalue(), "path": f"frame_{t:06d}.png"})
        columns[image_camera] = pa.array(pngs, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    return pa.table(columns)


def info(version: str, cameras: dict[str, str], **paths: str) -> dict:
    features = {
        "action": {"dtype": "float32", "shape": [ACTION_DIM[version]], "names": None},
        "observation.state": {"dtype": "float32", "shape": [STATE_DIM[version]], "names": None},
    }
    for camera, dtype in cameras.items():
        height, width = SIZES[camera]
        features[camera] = {
            "dtype": dtype,
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
        }
        if dtype == "video":
            features[camera]["info"] = {"video.fps": FPS, "video.height": height, "video.width": width}
    for key, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64")):
        features[key] = {"dtype": dtype, "shape": [1], "names": None}
    features["index"] = features["task_index"] = {"dtype": "int64", "shape": [1], "names": None}
    episodes = EPISODES[version]
    return {
        "codebase_version": version,
        "robot_type": "test_arm",
        "total_episodes": len(episodes),
        "total_frames": sum(map(len, episodes)),
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "fps": FPS,
        "splits": {"train": f"0:{len(episodes)}"},
        **paths,
        "features": features,
    }


def build_v21(root: Path) -> Path:
    """LeRobot v2.1: one parquet and one mp4 per camera per episode, episodes.jsonl / tasks.jsonl."""
    (root / "meta").mkdir(parents=True)
    layout = info(
        "v2.1",
        {TOP: "video", WRIST: "video"},
        data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        video_path="videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
    )
    (root / "meta" / "info.json").write_text(json.dumps(layout, indent=4))
    episodes_jsonl, first_index = [], 0
    for episode, tasks in enumerate(EPISODES["v2.1"]):
        path = root / f"data/chunk-000/episode_{episode:06d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows("v2.1", episode, first_index), path)
        for camera in (TOP, WRIST):
            frames = [frame(camera, episode, t) for t in range(len(tasks))]
            encode_video(root / f"videos/chunk-000/{camera}/episode_{episode:06d}.mp4", frames, "libx264")
        names = sorted({TASKS[i] for i in tasks})
        episodes_jsonl.append({"episode_index": episode, "tasks": names, "length": len(tasks)})
        first_index += len(tasks)
    lines = [json.dumps(e) for e in episodes_jsonl]
    (root / "meta" / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    tasks_jsonl = [json.dumps({"task_index": i, "task": task}) for i, task in enumerate(TASKS)]
    (root / "meta" / "tasks.jsonl").write_text("\n".join(tasks_jsonl) + "\n")
    return root


def build_v30(root: Path) -> Path:
    """LeRobot v3.0: episodes 0-1 share data file 0 and episode 2 is in file 1; the video files split otherwise
    (episode 0 alone in file 0; episodes 1 and 2 in file 1, episode 2 from 0.7 s on). The wrist camera is an
    "image" feature: PNG bytes in the rows."""
    codec = "libsvtav1" if "libsvtav1" in av.codecs_available else "libx264"  # lerobot's default codec is AV1
    layout = info(
        "v3.0",
        {TOP: "video", WRIST: "image"},
        data_path="data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        video_path="videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    )
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(layout, indent=4))
    lengths = [len(tasks) for tasks in EPISODES["v3.0"]]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    data_file = [0, 0, 1]
    for file_index in (0, 1):
        episodes = [e for e in range(3) if data_file[e] == file_index]
        table = pa.concat_tables([rows("v3.0", e, starts[e], image_camera=WRIST) for e in episodes])
        path = root / f"data/chunk-000/file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    # As lerobot records: one mp4 per episode, then concatenated without re-encoding; an episode starts at the
    # summed durations of those before it in its file.
    parts = root / "parts"
    for e in range(3):
        encode_video(parts / f"{e}.mp4", [frame(TOP, e, t) for t in range(lengths[e])], codec)
    video_file, video_start = [0, 1, 1], [0.0, 0.0, video_duration(parts / "1.mp4")]
    for file_index, episodes in ((0, [0]), (1, [1, 2])):
        concat_videos(
            [parts / f"{e}.mp4" for e in episodes], root / f"videos/{TOP}/chunk-000/file-{file_index:03d}.mp4"
        )
    shutil.rmtree(parts)
    metadata = {
        "episode_index": list(range(3)),
        "tasks": [sorted({TASKS[i] for i in tasks}) for tasks in EPISODES["v3.0"]],
        "length": lengths,
        "data/chunk_index": [0, 0, 0],
        "data/file_index": data_file,
        "dataset_from_index": starts[:-1],
        "dataset_to_index": starts[1:],
        f"videos/{TOP}/chunk_index": [0, 0, 0],
        f"videos/{TOP}/file_index": video_file,
        f"videos/{TOP}/from_timestamp": video_start,
        f"videos/{TOP}/to_timestamp": [s + n / FPS for s, n in zip(video_start, lengths, strict=True)],
        "stats/action/min": [[-3.0] * ACTION_DIM["v3.0"]] * 3,
        "meta/episodes/chunk_index": [0, 0, 0],
        "meta/episodes/file_index": [0, 0, 0],
    }
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(pa.table(metadata), root / "meta/episodes/chunk-000/file-000.parquet")
    # lerobot writes tasks with pandas, the text as the index: a "task" column beside task_index.
    pq.write_table(pa.table({"task_index": range(len(TASKS)), "task": TASKS}), root / "meta/tasks.parquet")
    return root


@pytest.fixture(scope="module")
def convert() -> ModuleType:
    return import_script("convert_to_rlds")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lerobot")
    return {"v2.1": build_v21(root / "v21"), "v3.0": build_v30(root / "v30")}


@pytest.fixture(scope="module")
def converted(
    convert: ModuleType, sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """Both sources converted by the command line: `lerobot_v21` (last episode held out), `lerobot_v30`."""
    root = tmp_path_factory.mktemp("rlds")
    for version, name, extra in (
        ("v2.1", "lerobot_v21", ["--val_fraction", "0.34"]),
        ("v3.0", "lerobot_v30", []),
    ):
        argv = ["--lerobot_dir", str(sources[version]), "--data_root_dir", str(root), "--name", name, *extra]
        assert convert.main(argv) == 0
    return root


def read_rlds(dataset_dir: Path) -> dict[str, dict[int, dict]]:
    """split -> LeRobot episode_index -> {images, state, action, instructions} straight from the tfrecords."""
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(dataset_dir))
    out: dict[str, dict[int, dict]] = {}
    for split in builder.info.splits:
        out[split] = {}
        for episode in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
            index = int(episode["episode_metadata"]["file_path"].decode().rsplit("=", 1)[1])
            steps = list(episode["steps"])
            out[split][index] = {
                "images": {k: np.stack([s["observation"][k] for s in steps]) for k in ("top", "wrist")},
                "state": np.stack([s["observation"]["state"] for s in steps]),
                "action": np.stack([s["action"] for s in steps]),
                "instructions": [s["language_instruction"].decode() for s in steps],
                "flags": [(s["is_first"], s["is_last"]) for s in steps],
            }
    return out


@pytest.mark.parametrize("version, name", [("v2.1", "lerobot_v21"), ("v3.0", "lerobot_v30")])
def test_episodes_steps_values_and_frames_arrive_intact(converted: Path, version: str, name: str) -> None:
    splits = read_rlds(converted / name / "1.0.0")
    expected_splits = {"train": [0, 1], "val": [2]} if version == "v2.1" else {"train": [0, 1, 2]}
    assert {split: sorted(episodes) for split, episodes in splits.items()} == expected_splits
    for split, episodes in splits.items():
        for index, got in episodes.items():
            tasks = EPISODES[version][index]
            num_steps = len(tasks)
            action, state = vectors(version, index, num_steps)
            np.testing.assert_array_equal(got["action"], action)  # exact: float32 in, float32 out
            np.testing.assert_array_equal(got["state"], state)
            assert got["instructions"] == [TASKS[i] for i in tasks], (split, index)
            assert got["flags"] == [(t == 0, t == num_steps - 1) for t in range(num_steps)]
            for key, camera in (("top", TOP), ("wrist", WRIST)):
                images = got["images"][key]
                assert images.shape == (num_steps, *SIZES[camera], 3)
                expected = np.stack([frame(camera, index, t) for t in range(num_steps)]).astype(int)
                error = np.abs(interior(images.astype(int)) - interior(expected)).max()
                assert error <= TOLERANCE, (version, index, camera, error)


def test_plugin_files_register_what_was_converted(
    convert: ModuleType, converted: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("lerobot_v21", "lerobot_v30"):
        _load_plugin(converted / name / f"{name}_dataset.py", monkeypatch)
    v21, v30 = configs.get_dataset_config("lerobot_v21"), configs.get_dataset_config("lerobot_v30")
    assert v30.image_obs_keys == {"primary": "top", "secondary": None, "wrist": "wrist"}
    assert v30.state_obs_keys == ("state",) and v30.standardize_fn == "identity"
    assert v30.action_encoding == configs.ActionEncoding.EEF_POS  # 7 numbers
    assert v30.action_normalization_mask == (True,) * 7  # LeRobot grippers are positions: normalise them too
    # 6 numbers: JOINT_POS, padded to 8 by the plugin's own function, zeros before the last (gripper) number.
    assert v21.action_encoding == configs.ActionEncoding.JOINT_POS
    assert v21.standardize_fn == "lerobot_v21_pad_actions"
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    action = np.arange(12, dtype=np.float32).reshape(2, 6)
    pad = transforms.get_standardize_fn(v21.standardize_fn)
    expected = np.concatenate([action[:, :5], np.zeros((2, 2)), action[:, 5:]], axis=1)
    np.testing.assert_array_equal(pad({"action": tf.constant(action)})["action"].numpy(), expected)
    # More than 8 numbers (a bimanual arm's 14) fit no encoding: the file says what to edit instead of registering.
    bimanual = tmp_path / "aloha_dataset.py"
    text = convert.dataset_plugin("aloha", ["top"], 14, 14, data_root_dir=tmp_path, origin="x", mapping=[])
    bimanual.write_text(text)
    with pytest.raises(ConfigError, match="'aloha' has 14-dim actions.*Edit this file"):
        runpy.run_path(str(bimanual))


def test_the_action_meaning_is_stated_or_inferred_and_the_entry_agrees(
    convert: ModuleType,
    sources: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A 7-number joint-space LeRobot action stated with --action_space joint_positions: JOINT_POS padded to 8, every
    dimension absolute, no "delta" in the entry; the inference says what it chose; tfds says nothing of downloads."""
    argv = ["--lerobot_dir", str(sources["v3.0"]), "--data_root_dir", str(tmp_path), "--name", "arm7"]
    assert convert.main([*argv, "--action_space", "joint_positions"]) == 0
    out = capfd.readouterr().out
    assert "Downloading and preparing" not in out and "downloaded and prepared" not in out
    assert (
        "action meaning: joint_positions = joint position targets, gripper last (stated by --action_space)"
        in out
    )
    _load_plugin(tmp_path / "arm7" / "arm7_dataset.py", monkeypatch)
    arm = configs.get_dataset_config("arm7")
    assert (
        arm.action_encoding == configs.ActionEncoding.JOINT_POS and arm.standardize_fn == "arm7_pad_actions"
    )
    assert arm.absolute_action_mask == (True,) * 8 and arm.action_normalization_mask == (True,) * 8
    entry = convert.registry_entry(
        "arm7", ["top"], 5, 7, meaning=convert.action_meaning("joint_positions", 7)
    )
    assert "delta" not in entry and "absolute targets" in entry

    # Inferred: 7 numbers of a LeRobot dataset are an absolute EEF pose (all absolute, and the comment says so);
    # joint names make them joint positions; episode files keep OpenVLA's EEF deltas with an absolute gripper.
    inferred = convert.action_meaning("infer", 7, lerobot=True)
    assert inferred.space == "eef_absolute" and "inferred" in inferred.how
    entry = convert.registry_entry("x", ["top"], 5, 7, meaning=inferred)
    assert (
        "absolute EEF pose" in entry and "delta" not in entry and "absolute_action_mask=(True,) * 7" in entry
    )
    names = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "x", "gripper"]
    assert convert.action_meaning("infer", 7, lerobot=True, names=names).space == "joint_positions"
    episode_files = convert.registry_entry("x", ["image"], 8, 7)
    assert "EEF deltas" in episode_files and "absolute_action_mask" not in episode_files
    with pytest.raises(ConfigError, match="--action_space eef_delta needs 7 action numbers.*have 6"):
        convert.action_meaning("eef_delta", 6)
    with pytest.raises(ConfigError, match="--action_space 'joint_position' is not one of.*joint_positions"):
        convert.ConvertConfig(tmp_path, "x", lerobot_dir=tmp_path, action_space="joint_position")


def _load_plugin(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Import a plugin file, then hand what it registered to monkeypatch so the registries are restored after."""
    datasets, functions = set(configs.DATASET_CONFIGS), set(transforms.STANDARDIZE_FNS)
    runpy.run_path(str(path))
    for registry, before in ((configs.DATASET_CONFIGS, datasets), (transforms.STANDARDIZE_FNS, functions)):
        for key in set(registry) - before:
            monkeypatch.setitem(
                registry, key, registry.pop(key)
            )  # setitem on an absent key: deleted at teardown


def test_reader_picks_and_orders_cameras(sources: dict[str, Path]) -> None:
    source = open_lerobot(sources["v3.0"], cameras=[WRIST])
    assert (
        source.version == "v3.0" and source.cameras == [WRIST] and source.observation_keys == {WRIST: "wrist"}
    )
    assert (source.action_dim, source.state_dim, [ref.index for ref in source.episodes]) == (7, 5, [0, 1, 2])
    episode = source.load_episode(source.episodes[2])
    assert list(episode["images"]) == ["wrist"] and episode["instruction"] == TASKS[2]
    np.testing.assert_array_equal(episode["images"]["wrist"][4], frame(WRIST, 2, 4))  # PNG: exact
    # Episode 2 starts 0.7 s into the shared mp4: its frames, not episode 1's, and in order.
    both = open_lerobot(sources["v3.0"])
    top = both.load_episode(both.episodes[2])["images"]["top"]
    expected = np.stack([frame(TOP, 2, t) for t in range(5)]).astype(int)
    assert np.abs(top.astype(int) - expected).max() <= 3  # yuv420p rounding only
    with pytest.raises(
        ConfigError, match="names 'observation.images.front'.*Valid choices: observation.images.top"
    ):
        open_lerobot(sources["v2.1"], cameras=["observation.images.front"])


def _edited_copy(source: Path, tmp_path: Path, **info_changes: object) -> Path:
    copy = tmp_path / source.name
    shutil.copytree(source, copy)
    path = copy / "meta" / "info.json"
    layout = json.loads(path.read_text())
    for key, value in info_changes.items():
        if value is None:
            layout["features"].pop(key)
        else:
            layout[key] = value
    path.write_text(json.dumps(layout))
    return copy


def test_clear_errors(convert: ModuleType, sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "rlds"
    with pytest.raises(ConfigError) as error:
        convert.convert_lerobot(
            _edited_copy(sources["v2.1"], tmp_path / "a", codebase_version="v2.0"), out, "x"
        )
    assert 'codebase_version "v2.0"' in str(error.value) and "v2.1 or v3.0" in str(error.value)
    with pytest.raises(ConfigError, match="has no 'action' feature"):
        convert.convert_lerobot(_edited_copy(sources["v3.0"], tmp_path / "b", action=None), out, "x")
    missing = _edited_copy(sources["v2.1"], tmp_path / "c")
    video = missing / f"videos/chunk-000/{WRIST}/episode_000001.mp4"
    video.unlink()
    with pytest.raises(ConfigError) as error:
        convert.convert_lerobot(missing, out, "x")
    assert f"camera '{WRIST}' for episode 1 is missing: '{video}'" in str(error.value)
    assert "--lerobot_cameras" in str(error.value)
    assert convert.convert_lerobot(
        missing, out, "x", cameras=[TOP]
    ).is_dir()  # without that camera it converts
    with pytest.raises(ConfigError, match="no meta/info.json"):
        convert.convert_lerobot(tmp_path, out, "x")
    with pytest.raises(ConfigError, match="exactly one of --episodes_dir .* and --lerobot_dir .*; got both"):
        convert.ConvertConfig(out, "x", episodes_dir=tmp_path, lerobot_dir=tmp_path)
    with pytest.raises(ConfigError, match="got neither"):
        convert.ConvertConfig(out, "x")


def test_train_on_a_converted_lerobot_dataset(converted: Path, tmp_path: Path) -> None:
    """One single-process run of the tiny preset reads `lerobot_v21` (6-dim actions, padded to 8) through its plugin."""
    plugin = converted / "lerobot_v21" / "lerobot_v21_dataset.py"
    args = ["--plugins", str(plugin), "--vla.type", "tiny+mx-toy", "--vla.data_mix", "lerobot_v21"]
    args += ["--vla.expected_world_size", "1", "--vla.max_steps", "2", "--vla.global_batch_size", "4"]
    args += ["--vla.per_device_batch_size", "4", "--vla.shuffle_buffer_size", "8", "--save_interval", "2"]
    args += ["--data_root_dir", str(converted), "--run_root_dir", str(tmp_path), "--run_id", "lerobot"]
    done = run_train([*args, "--trackers", "jsonl"], nproc=None)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    metrics = [json.loads(line) for line in (tmp_path / "lerobot" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(np.isfinite(m["loss"]) for m in metrics)
    stats = json.loads((tmp_path / "lerobot" / "dataset_statistics.json").read_text())["lerobot_v21"]
    assert stats["num_trajectories"] == 3 and stats["num_transitions"] == 18
    assert stats["action"]["min"][5:7] == [0.0, 0.0] and stats["action"]["mask"] == [True] * 8
