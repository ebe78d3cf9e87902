"""Running experiments: one run, the MLRC protocol, many runs in worker processes.

``runner`` is the entry point (``train``/``evaluate`` a run folder; MLRC configs go through
``mlrc``), ``training`` is the epoch loop of one run (its state and result in ``run_state``),
``evaluate`` scores a run, ``checkpoints`` saves and loads run state, ``resume`` says what may
change on ``--resume``, ``run_folder`` holds the folder's lock and overwrite rules, ``nonfinite``
stops a run at the first NaN/inf, ``distributed`` is the torchrun glue, ``pool`` runs many jobs
(``--jobs K``) with failure isolation (``console`` labels and folds their log lines) and ``load``
hands a trained run's models to the user (``load_run``, ``embed``, ``pml-rank embed``).

Import direction: imports :mod:`pml_rank_plugins.experiment`; imported by
:mod:`pml_rank_plugins.reporting`.
"""

from .checkpoints import CheckpointError, atomic_torch_save, choose_checkpoint, load_checkpoint
from .console import repeated_logs_once
from .distributed import (
    RankTimeoutError,
    TorchrunRefusedError,
    barrier,
    is_main_process,
    named_timeouts,
    refuse_under_torchrun,
    shutdown,
)
from .evaluate import evaluate_run, read_run_config
from .load import LoadedRun, embed, embeddings_files, load_run, save_embeddings
from .mlrc import evaluate_mlrc, train_mlrc
from .nonfinite import NonFiniteCheck, NonFiniteError
from .own_images import EvalTransform, ImageFiles, find_images, image_dataset
from .pool import FAILED_FILE, Job, execute, is_failed, make_jobs, run_job
from .run_folder import (
    DiskFullError,
    RunFolderBusy,
    RunFolderError,
    StorageError,
    UnsafeRunFolder,
)
from .runner import evaluate, train
from .training import train_run

__all__ = [
    "FAILED_FILE",
    "CheckpointError",
    "DiskFullError",
    "Job",
    "LoadedRun",
    "NonFiniteCheck",
    "NonFiniteError",
    "RankTimeoutError",
    "RunFolderBusy",
    "RunFolderError",
    "StorageError",
    "TorchrunRefusedError",
    "UnsafeRunFolder",
    "atomic_torch_save",
    "barrier",
    "choose_checkpoint",
    "EvalTransform",
    "ImageFiles",
    "embed",
    "embeddings_files",
    "evaluate",
    "evaluate_mlrc",
    "evaluate_run",
    "execute",
    "is_failed",
    "is_main_process",
    "load_checkpoint",
    "find_images",
    "image_dataset",
    "load_run",
    "make_jobs",
    "named_timeouts",
    "read_run_config",
    "refuse_under_torchrun",
    "repeated_logs_once",
    "run_job",
    "save_embeddings",
    "shutdown",
    "train",
    "train_mlrc",
    "train_run",
]
