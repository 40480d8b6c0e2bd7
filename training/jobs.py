"""Training jobs: each in its own (spawned) process, bounded in number and wall time, stoppable
within a second, a crash recorded as ``failed`` with its message.

Job types are registered by name (`register_job_type`, see `training/job_types.py`): a pydantic
config model that the API process validates (it must import without torch) and the import path
of a trainer ``fn(config, ctx: TrainContext) -> dict`` that only the job process imports.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from training.context import TrainContext

log = logging.getLogger(__name__)

JobStatus = Literal["pending", "running", "completed", "failed", "stopped"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "stopped"})
STOP_GRACE_S = 0.8
"""A stopped job saves and exits within this, or is terminated (its last checkpoint stays)."""
KILL_GRACE_S = 5.0
"""Past its wall-time limit a job gets this long to stop by itself before it is killed."""


@dataclass(frozen=True)
class JobType:
    name: str
    config_model: type[BaseModel]
    target: str
    """``"module:function"``, the trainer, imported in the job process only."""
    description: str = ""
    prepare: Callable[[Any, Path, str], None] | None = None
    """Runs in the service at submit, before the process starts: ``(config, models_dir, model_name)``
    (e.g. writes the initial model). Must be quick and must not import torch."""
    confine: Callable[[Any, Path, Path], Any] | None = None
    """Runs in the service at submit, first: ``(config, models_dir, data_dir) -> config`` with the
    paths the config names resolved inside the service's directories; ValueError naming the field
    when one is not there (a job never reads an arbitrary server path)."""


JOB_TYPES: dict[str, JobType] = {}


def register_job_type(job_type: JobType) -> JobType:
    JOB_TYPES[job_type.name] = job_type
    return job_type


def get_job_type(name: str) -> JobType:
    try:
        return JOB_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown job type {name!r}; known: {', '.join(sorted(JOB_TYPES))}") from None


def load_target(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class JobLimitReached(Exception):
    """As many jobs as allowed are already running."""


class ModelNameTaken(Exception):
    """The model name exists (and overwrite is off), or a running job writes it."""


class JobConfigRefused(ValueError):
    """A valid config that asks for what this server does not give a job (more threads than
    ``threads_per_job``, a path outside its directories); the message names the field."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Job:
    job_id: str
    job_type: str
    config: dict[str, Any]
    model_name: str
    status: JobStatus = "pending"
    progress: float = 0.0
    current_timesteps: int = 0
    total_timesteps: int = 0
    start_time: str = field(default_factory=now_iso)
    end_time: str | None = None
    error_message: str | None = None
    end_reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # Process handles (not part of the record).
    process: Any = field(default=None, repr=False)
    conn: Any = field(default=None, repr=False)
    stop_event: Any = field(default=None, repr=False)
    deadline: float = field(default=0.0, repr=False)
    stop_requested: bool = field(default=False, repr=False)
    """Set before the stop event: a process that ends after it was asked to stop is ``stopped``."""

    def record(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in (
                "job_id",
                "job_type",
                "config",
                "model_name",
                "status",
                "progress",
                "current_timesteps",
                "total_timesteps",
                "start_time",
                "end_time",
                "error_message",
                "end_reason",
                "metrics",
            )
        }


def _job_main(
    target: str, config_model: str, config: dict[str, Any], ctx_args: dict[str, Any], conn: Any, stop: Any
) -> None:
    """Entry point of a job process."""
    try:
        threads = int(ctx_args.pop("threads", 1))
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        for module in ctx_args.pop("plugins", ()):  # e.g. the user's reward functions
            importlib.import_module(module)
        fn = load_target(target)
        model_cls = load_target(config_model)
        cfg = model_cls.model_validate(config)
        try:
            import torch

            torch.set_num_threads(threads)
        except ImportError:
            pass
        last_sent = 0.0

        def report(current: int, total: int, metrics: dict[str, float]) -> None:
            nonlocal last_sent
            now = time.monotonic()
            if now - last_sent >= 0.1 or current >= total:  # at most 10 messages a second
                conn.send(("progress", current, total, metrics))
                last_sent = now

        conn.send(("started",))
        ctx = TrainContext(
            models_dir=Path(ctx_args["models_dir"]),
            model_name=ctx_args["model_name"],
            report=report,
            should_stop=stop.is_set,
            deadline=time.monotonic() + ctx_args["wall_time_s"],
        )
        summary = fn(cfg, ctx)
        conn.send(("done", summary))
    except BaseException as exc:  # the job's failure, reported; the process ends either way
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        with contextlib.suppress(Exception):
            conn.send(("failed", detail, traceback.format_exc()))
    finally:
        conn.close()


class JobRunner:
    """Starts, watches, stops and remembers training jobs (one process each)."""

    def __init__(
        self,
        models_dir: Path,
        *,
        jobs_dir: Path | None = None,
        max_active: int = 2,
        max_wall_time_s: float = 3600.0,
        max_finished: int = 1000,
        threads_per_job: int = 1,
        data_dir: Path | None = None,
        model_exists: Callable[[str], bool] | None = None,
        new_job_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        plugins: tuple[str, ...] = (),
    ) -> None:
        self.models_dir = models_dir
        self.jobs_dir = jobs_dir
        self.max_active = max_active
        self.max_wall_time_s = max_wall_time_s
        self.max_finished = max_finished
        self.threads_per_job = threads_per_job
        self.data_dir = data_dir if data_dir is not None else models_dir.parent / "datasets"
        """Where the job API's ``dataset`` names are looked up (`JobType.confine`)."""
        self.model_exists = model_exists or (lambda name: (models_dir / f"{name}.zip").exists())
        self.new_job_id = new_job_id
        self.plugins = plugins
        """Modules every job process imports first (they register reward functions, job types)."""
        self.jobs: dict[str, Job] = {}
        self._lock = threading.RLock()
        self._mp = multiprocessing.get_context("spawn")
        self._closed = threading.Event()
        self._wake_r, self._wake_w = self._mp.Pipe(duplex=False)
        self._watcher: threading.Thread | None = None  # started with the first job
        self._load_records()

    # ------------------------------------------------------------------------------ queries

    def get(self, job_id: str) -> Job:
        with self._lock:
            try:
                return self.jobs[job_id]
            except KeyError:
                raise KeyError(f"no training job {job_id!r}") from None

    def list(self) -> list[Job]:
        with self._lock:
            return sorted(self.jobs.values(), key=lambda j: j.start_time)

    def active(self) -> list[Job]:
        with self._lock:
            return [j for j in self.jobs.values() if j.status not in TERMINAL]

    def job_writing(self, name: str) -> Job | None:
        """The pending or running job that saves model ``name``, if any."""
        return next((j for j in self.active() if j.model_name == name), None)

    def model_in_use(self, name: str) -> bool:
        return self.job_writing(name) is not None

    # ------------------------------------------------------------------------------ actions

    def submit(self, job_type: JobType, config: BaseModel, *, wall_time_s: float | None = None) -> Job:
        """Start a job (config already validated). The config's ``model_name`` is filled in.
        `JobConfigRefused` when the config asks for more threads than ``threads_per_job`` or names
        a path outside the service's directories."""
        threads = getattr(config, "threads", None)
        if isinstance(threads, int) and threads > self.threads_per_job:
            raise JobConfigRefused(
                f"threads: {threads} is more than this server gives a job "
                f"(TRAINING_THREADS_PER_JOB={self.threads_per_job})"
            )
        if job_type.confine is not None:
            try:
                config = job_type.confine(config, self.models_dir, self.data_dir)
            except ValueError as exc:
                raise JobConfigRefused(str(exc)) from None
        job_id = self.new_job_id()
        name = getattr(config, "model_name", None) or f"grpo_model_{job_id[-12:]}"
        config = config.model_copy(update={"model_name": name})
        overwrite = bool(getattr(config, "overwrite", False))
        limit = self.max_wall_time_s
        own = getattr(config, "max_wall_time_s", None)
        wall = min(x for x in (limit, own, wall_time_s) if x is not None)
        with self._lock:
            if self._closed.is_set():
                raise JobLimitReached("the job runner is shutting down")
            if len(self.active()) >= self.max_active:
                raise JobLimitReached(f"{self.max_active} training jobs are already running (the limit)")
            if self.model_in_use(name):
                raise ModelNameTaken(f"model {name!r} is being written by a running job")
            if not overwrite and self.model_exists(name):
                raise ModelNameTaken(f"model {name!r} already exists (set overwrite to replace it)")
            parent_conn, child_conn = self._mp.Pipe(duplex=False)
            stop = self._mp.Event()
            job = Job(
                job_id=job_id,
                job_type=job_type.name,
                config=config.model_dump(mode="json"),
                model_name=name,
                total_timesteps=int(getattr(config, "total_timesteps", 0) or 0),
                conn=parent_conn,
                stop_event=stop,
                deadline=time.monotonic() + wall + KILL_GRACE_S,
            )
            model_path = f"{type(config).__module__}:{type(config).__qualname__}"
            ctx_args = {
                "models_dir": str(self.models_dir),
                "model_name": name,
                "wall_time_s": wall,
                "threads": self.threads_per_job,
                "plugins": list(self.plugins),
            }
            job.process = self._mp.Process(
                target=_job_main,
                args=(job_type.target, model_path, job.config, ctx_args, child_conn, stop),
                name=f"train-{job_id[:8]}",
                daemon=True,
            )
            self.models_dir.mkdir(parents=True, exist_ok=True)
            if job_type.prepare is not None:
                job_type.prepare(config, self.models_dir, name)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="training-jobs", daemon=True)
                self._watcher.start()
            job.process.start()
            child_conn.close()
            self.jobs[job_id] = job
            self._persist(job)
            self._prune()
        self._wake()
        return job

    def stop(self, job_id: str, grace_s: float = STOP_GRACE_S) -> Job:
        """Ask the job to stop; it saves and exits, or is terminated after ``grace_s``. Blocking
        (call it from a thread in async code)."""
        job = self.get(job_id)
        if job.status in TERMINAL:
            return job
        job.stop_requested = True  # before the event: the watcher may see the process end first
        job.stop_event.set()
        job.process.join(grace_s)
        if job.process.is_alive():
            job.process.terminate()
            job.process.join(0.15)
            if job.process.is_alive():
                job.process.kill()
                job.process.join(0.1)
        self._drain(job)
        self._finish(job, "stopped", end_reason="stopped")
        return job

    def close(self) -> None:
        """Stop every job (at shutdown)."""
        self._closed.set()
        for job in self.active():
            self.stop(job.job_id, grace_s=0.5)
        self._wake()
        if self._watcher is not None:
            self._watcher.join(2.0)
        self._wake_r.close()
        self._wake_w.close()

    # ------------------------------------------------------------------------------ internals

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(None)

    def _watch(self) -> None:
        while not (self._closed.is_set() and not self.active()):
            jobs = self.active()
            conns = [j.conn for j in jobs if j.conn is not None and not j.conn.closed]
            try:
                ready = multiprocessing.connection.wait([self._wake_r, *conns], timeout=0.25)
            except OSError:
                ready = []
            if self._wake_r in ready:
                while self._wake_r.poll():
                    self._wake_r.recv()
            for job in jobs:
                try:
                    if job.conn in ready:
                        self._drain(job)
                    if job.status in TERMINAL:
                        continue
                    if job.process.exitcode is not None:
                        self._drain(job)
                        if job.status in TERMINAL:
                            continue
                        if job.stop_requested:  # stopped (or terminated by stop()) before a word
                            self._finish(job, "stopped", end_reason="stopped")
                        else:
                            code = job.process.exitcode
                            self._finish(job, "failed", error=f"the job process exited with code {code}")
                    elif time.monotonic() > job.deadline:
                        job.process.kill()
                        job.process.join(1.0)
                        self._finish(job, "failed", error="killed: exceeded its wall-time limit")
                except Exception:  # one job's trouble must not stop the watcher
                    log.exception("watching job %s", job.job_id)

    def _drain(self, job: Job) -> None:
        with self._lock:  # the watcher and stop() may both drain a job
            conn = job.conn
            while conn is not None and not conn.closed:
                try:
                    if not conn.poll():
                        return
                    message = conn.recv()
                except (EOFError, OSError):
                    conn.close()
                    return
                self._apply(job, message)

    def _apply(self, job: Job, message: tuple[Any, ...]) -> None:
        kind = message[0]
        with self._lock:
            if job.status in TERMINAL:
                return
            if kind == "started":
                job.status = "running"
            elif kind == "progress":
                _, current, total, metrics = message
                job.status = "running"
                job.current_timesteps, job.total_timesteps = int(current), int(total)
                job.progress = min(1.0, current / total) if total else 0.0
                job.metrics = dict(metrics)
            elif kind == "done":
                summary = message[1] or {}
                reason = summary.get("reason", "completed")
                if summary.get("metrics"):
                    job.metrics = dict(summary["metrics"])
                status: JobStatus = "stopped" if reason == "stopped" else "completed"
                if status == "completed":
                    job.progress = 1.0
                self._finish(job, status, end_reason=reason)
            elif kind == "failed":
                log.warning("training job %s failed:\n%s", job.job_id, message[2])
                self._finish(job, "failed", error=message[1])

    def _finish(
        self, job: Job, status: JobStatus, *, error: str | None = None, end_reason: str | None = None
    ) -> None:
        with self._lock:
            if job.status in TERMINAL:
                return
            job.status = status
            job.end_time = now_iso()
            job.error_message = error
            job.end_reason = end_reason or ("error" if status == "failed" else status)
            self._persist(job)

    def _persist(self, job: Job) -> None:
        if self.jobs_dir is None:
            return
        try:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.jobs_dir / f".{job.job_id}.json.tmp"
            tmp.write_text(json.dumps(job.record()), encoding="utf-8")
            tmp.replace(self.jobs_dir / f"{job.job_id}.json")
        except OSError:
            log.exception("cannot record job %s", job.job_id)

    def _load_records(self) -> None:
        """Jobs of an earlier run of the service; one that was running then is failed now."""
        if self.jobs_dir is None or not self.jobs_dir.is_dir():
            return
        for path in self.jobs_dir.glob("*.json"):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                job = Job(**{k: v for k, v in data.items() if k in Job.__dataclass_fields__})
            except (OSError, ValueError, TypeError):
                continue
            if job.status not in TERMINAL:
                job.status, job.end_time = "failed", job.end_time or now_iso()
                job.error_message = "the service stopped while the job ran"
                self._persist(job)
            self.jobs[job.job_id] = job
        self._prune()

    def _prune(self) -> None:
        finished = sorted((j for j in self.jobs.values() if j.status in TERMINAL), key=lambda j: j.start_time)
        for job in finished[: max(0, len(finished) - self.max_finished)]:
            del self.jobs[job.job_id]
            if self.jobs_dir is not None:
                (self.jobs_dir / f"{job.job_id}.json").unlink(missing_ok=True)
