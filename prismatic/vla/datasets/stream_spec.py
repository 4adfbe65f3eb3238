"""`StreamSpec`: the one typed object that defines a rank's stream of frames, handed down the data layer.

Training (`RLDSDataset`), validation (`Validator`, which derives its held-out streams from the training spec with
`dataclasses.replace`), offline evaluation and the pipeline itself (`make_interleaved_dataset`) all read the same
fields, so a new data option is one field here instead of a keyword restated through every layer. Torch- and
TensorFlow-free: the config layer may build one.

    spec = StreamSpec(Path("data/rlds"), "bridge", (224, 224), seed=7, rank=rank, world_size=world_size)
    dataset = RLDSDataset(spec, batch_transform)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError


@dataclass(frozen=True)
class StreamSpec:
    """Everything that defines one rank's stream of frames (fingerprinted for resume, see `RLDSDataset`).

    Attributes:
        data_root_dir: folder holding `<name>/<version>/` for every dataset of the mixture.
        data_mix: a mixture name (`rlds/mixtures.py`) or a single registered dataset name.
        resize_resolution: (height, width) of the yielded images.
        shuffle_buffer_size: frames in the shuffle buffer (train only; >= 1 when training).
        options: statistics, filtering, proprio and chunking choices (`DataOptions`; defaults as OpenVLA).
        image_views: the camera views frames carry, in order, each as `observation.image_<view>` (views of
            `rlds.configs.CAMERA_VIEWS`); a dataset without a camera for a view gets black images for it.
        window_size, future_action_window_size: observation history length and number of future actions per
            frame (action chunking); (1, 0) gives OpenVLA's single-step frames.
        keep_raw_action: frames also carry `raw_action`, the standardised action before normalisation
            (evaluation in robot units); off for training, where it would only cost buffer memory.
        image_aug: augment images (train only).
        seed, rank, world_size: the stream is a deterministic function of these; ranks read disjoint trajectories.
        train: True -> train split, shuffled, infinite; False -> held-out split, one deterministic pass.
        start_sample: skip this many frames of this rank's stream (resume).
        skip_missing_datasets: drop (with a warning) mixture datasets missing under `data_root_dir` instead of
            raising; weights are re-balanced over the rest.
        shuffle_buffer_ram_gb: RAM budget (GiB) of the shuffle buffer (train); None = `$PRISMATIC_SHUFFLE_BUFFER_GB`
            or half the physical RAM shared by the node's ranks (`rlds.buffer.default_shuffle_buffer_ram_gb`).
        recompute_stats: compute every dataset's statistics again, ignoring (and overwriting) their caches.

    Raises:
        ConfigError: a value out of range (rank, start_sample, shuffle_buffer_size, chunk window, resolution).
    """

    data_root_dir: Path
    data_mix: str
    resize_resolution: tuple[int, int]
    shuffle_buffer_size: int = 256_000
    options: DataOptions = field(default_factory=DataOptions)
    image_views: tuple[str, ...] = ("primary",)
    window_size: int = 1
    future_action_window_size: int = 0
    keep_raw_action: bool = False
    image_aug: bool = False
    seed: int = 7
    train: bool = True
    rank: int = 0
    world_size: int = 1
    start_sample: int = 0
    skip_missing_datasets: bool = False
    shuffle_buffer_ram_gb: float | None = None
    recompute_stats: bool = False

    def __post_init__(self) -> None:
        # Frozen: normalise the sequence-typed fields in place, so that equal specs compare and hash equal.
        object.__setattr__(self, "data_root_dir", Path(self.data_root_dir))
        views = self.image_views
        object.__setattr__(self, "image_views", (views,) if isinstance(views, str) else tuple(views))
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"Need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}."
            )
        if self.start_sample < 0:
            raise ConfigError(f"start_sample must be >= 0, got {self.start_sample}.")
        if self.train and self.shuffle_buffer_size < 1:
            raise ConfigError(f"shuffle_buffer_size must be >= 1, got {self.shuffle_buffer_size}.")
        if self.window_size < 1 or self.future_action_window_size < 0:
            raise ConfigError(
                f"Need window_size >= 1 and future_action_window_size >= 0, got {self.window_size}, "
                f"{self.future_action_window_size}."
            )
        resolution = self.resize_resolution
        if len(resolution) != 2 or min(resolution) < 1:
            raise ConfigError(f"resize_resolution must be (height, width), got {resolution}.")
        object.__setattr__(self, "resize_resolution", (int(resolution[0]), int(resolution[1])))

    @property
    def windowed(self) -> bool:
        """Frames carry a history window or future actions (not OpenVLA's single-step frames)."""
        return self.window_size > 1 or self.future_action_window_size > 0
