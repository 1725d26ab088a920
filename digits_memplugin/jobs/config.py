"""The job manager's settings (jobs.manager.JobManager), read once from the plugin's settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..core.layers.base import ENGINE_CUDNN, ENGINE_GPU
from ..core.planning.fallback import DEFAULT_MAX_ATTEMPTS
from ..core.planning.job_plan import CPU_SAFETY_MARGIN, GPU_SAFETY_MARGIN, PlanningPolicy
from .backends import LOCAL
from .backends.attempt_process import CANCEL_SECONDS
from .child.caffe_build import BINARY, CaffeBuild, bundled
from .store.database import BUSY_SECONDS

MAX_QUEUED_JOBS = 100
MAX_STORED_JOBS = 1000
MAX_STORED_BYTES = 20 * 1024**3
JOB_NICE = 10
STALL_SECONDS = 600.0


@dataclasses.dataclass(frozen=True)
class ManagerConfig:
    data_dir: Path
    dataset_roots: tuple[Path, ...]
    jobs_per_gpu: int = 1
    jobs_per_cpu: int = 1
    cpu_memory_cap: int | None = None
    cpu_safety_margin: float = CPU_SAFETY_MARGIN
    gpu_safety_margin: float = GPU_SAFETY_MARGIN
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    gpu_engine: str = ENGINE_CUDNN
    poll_seconds: float = 1.0
    """How often waiting jobs are placed again and GPU memory of running attempts is sampled."""
    grace_seconds: float = 5.0
    """Between SIGTERM and SIGKILL when an attempt is stopped."""
    cancel_seconds: float = CANCEL_SECONDS
    """How long a cancelled attempt has to snapshot and stop (SIGINT) before it is stopped with SIGTERM."""
    store_progress_seconds: float = 1.0
    """Iteration records are written to the store at most this often per job (tests and snapshots always)."""
    max_queued_jobs: int = MAX_QUEUED_JOBS
    """Jobs that may wait in the queue at once; a submission (or a resume) beyond it is refused."""
    store_busy_seconds: float = BUSY_SECONDS
    """How long a store call waits while another process holds the database's write lock."""
    job_nice: int = JOB_NICE
    """The training child's nice value: the web server keeps the CPU first where training takes every core."""
    stall_seconds: float | None = STALL_SECONDS
    """Silence after which the watchdog ends an attempt (jobs.backends.watchdog); None: never (not for production)."""
    gpus_simulated: bool = False
    """The demo mode (--simulate-gpus): the GPUs' memory is made up and no CUDA device is behind them, so jobs that
    would train on a GPU are refused at submission rather than failing in Caffe."""
    max_stored_jobs: int = MAX_STORED_JOBS
    """Jobs kept at once, whatever their state; a submission beyond it is refused until some are deleted."""
    max_stored_bytes: int = MAX_STORED_BYTES
    """Bytes the jobs' folders may hold; a submission while they hold more is refused until some are deleted."""
    jobs_dir: Path | None = None
    """Where the job folders are (a folder every node sees, with the Ray backend); None: <data_dir>/jobs."""
    caffe: CaffeBuild = dataclasses.field(default_factory=bundled)
    """The Caffe that trains (caffe_build.py): its flavour decides which nets may train and how they are estimated,
    its pycaffe or its binary which runner trains them."""
    preload: str | None = None
    """The capped-start library the binary runner preloads into `caffe` (jobs/child/preload.py), built at start-up; None:
    the training child builds it if it needs it."""
    backend: str = LOCAL
    """Where attempts run (jobs.backends): this host's children, or a Ray cluster's nodes."""
    shared_store: bool = False
    """Several web workers share the data folder (a message queue carries their events): a manager that finds the
    folder held starts as a follower instead of failing, and the leader reads the queue and the cancel requests
    every `poll_seconds`, since a follower's writes cannot wake it (docs/scale-out.md)."""

    @property
    def policy(self) -> PlanningPolicy:
        """How this server plans jobs: the form, the REST estimate and the command line plan with the same."""
        return PlanningPolicy(
            gpu_engine=self.gpu_engine, cpu_safety_margin=self.cpu_safety_margin,
            gpu_safety_margin=self.gpu_safety_margin, max_attempts=self.max_attempts, flavour=self.caffe.flavour,
            apart_refused=self.apart_refused,
        )

    @property
    def apart_refused(self) -> str | None:
        """Why this server's jobs cannot keep their test nets apart (core.test_nets); None: they can."""
        if self.caffe.runner == BINARY:
            return (f"the Caffe that trains ({self.caffe.root or 'its root'}) has no pycaffe here, and its `caffe "
                    "train` runner keeps the test nets beside the train net, as caffe does")
        if self.backend != LOCAL:
            return f"the {self.backend} backend runs each attempt as one process on one node; the test nets stay beside the train net"
        return None

    @classmethod
    def from_settings(cls, settings: Any, caffe: CaffeBuild | None = None, preload: str | None = None) -> ManagerConfig:
        """The manager's settings, with the Caffe that trains (read at start-up; default: the bundled pycaffe)."""
        caffe = caffe or bundled()
        roots = settings.dataset_roots or (settings.data_dir / "datasets",)
        return cls(
            data_dir=settings.data_dir,
            dataset_roots=tuple(roots),
            jobs_per_gpu=settings.jobs_per_gpu,
            jobs_per_cpu=settings.jobs_per_cpu,
            cpu_memory_cap=settings.cpu_memory_cap,
            cpu_safety_margin=_first(settings.job_safety_margin, CPU_SAFETY_MARGIN),
            gpu_safety_margin=_first(settings.job_safety_margin, GPU_SAFETY_MARGIN),
            max_attempts=settings.job_max_attempts,
            gpu_engine=settings.gpu_engine or gpu_engine_for(caffe),
            caffe=caffe,
            preload=preload,
            max_queued_jobs=settings.max_queued_jobs,
            store_busy_seconds=settings.store_busy_seconds,
            job_nice=settings.job_nice,
            stall_seconds=settings.job_stall_seconds,
            cancel_seconds=settings.job_cancel_seconds,
            gpus_simulated=settings.simulate_gpus is not None,
            max_stored_jobs=settings.max_stored_jobs,
            max_stored_bytes=settings.max_stored_bytes,
            jobs_dir=None if settings.shared_dir is None else settings.shared_dir / "jobs",
            shared_store=settings.message_queue is not None,
            backend=settings.job_backend,
        )


def gpu_engine_for(caffe: CaffeBuild) -> str:
    """How GPU jobs are estimated when the settings do not say: with cuDNN, unless the Caffe that trains has CUDA
    without cuDNN (a Caffe without CUDA trains no GPU job; its GPU estimates are those of a CUDA + cuDNN build)."""
    return ENGINE_GPU if caffe.cuda and not caffe.cudnn else ENGINE_CUDNN


def _first(value: float | None, default: float) -> float:
    return default if value is None else value
