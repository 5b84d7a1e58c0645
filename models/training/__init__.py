"""Training the reference models: the loop, its tasks and data, checkpoints, pictures (the studies: models/studies).

The models (``models/*.py``) import nothing from here; this package imports them.

- ``config``: :class:`TrainConfig` and :data:`RUN_DEFAULTS`, the default run of each model;
- ``trainer``: :func:`train` (also under ``torchrun``) and :func:`load_trained`;
- ``tasks``, ``data``: what each model learns from, generated on the machine;
- ``checkpoint``, ``pictures``: safetensors checkpoints; sample grids, GIFs, loss curves;
- ``export``: a run as a diffusers model (needs diffusers; import it explicitly).
"""

from .config import RUN_DEFAULTS, TrainConfig, run_config
from .trainer import load_trained, train

__all__ = ["RUN_DEFAULTS", "TrainConfig", "load_trained", "run_config", "train"]
