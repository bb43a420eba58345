"""Start real multi-process engines on 127.0.0.1 for tests and benchmarks: a Dask cluster
(``dask scheduler`` + ``dask worker`` processes) and a Beam external SDK worker pool.

Each engine is a set of ``subprocess.Popen`` children with their output in log files, so a
test can read what ran where and a benchmark can read each worker's peak RSS.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Engine:
    """Running engine processes: ``address`` to pass to Beam, ``procs`` (scheduler/pool first,
    then workers) and their ``logs`` (one file per process, stdout and stderr together)."""
    address: str
    procs: list[subprocess.Popen]
    logs: list[Path]

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (all but the first)."""
        return [p.pid for p in self.procs[1:]]

    def log_text(self) -> str:
        """All logs concatenated (UTF-8, undecodable bytes replaced)."""
        return "".join(p.read_text(errors="replace") for p in self.logs)

    def stop(self) -> None:
        """Terminate workers first, then the scheduler/pool (waits up to 10 s each, then kills)."""
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _spawn(cmd: list[str], log: Path, env: dict | None) -> subprocess.Popen:
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


# Dask worker memory settings for a worker given a --memory-limit (see docs/cluster.md, "Dask"):
# results beyond SPILL_TARGET of the limit (by dask's size estimate) go to the worker's local disk
# as they are stored. Spilling on the process's measured memory and pausing are off: a Beam
# worker's own memory (imports, the language model, sentencepiece, the running task) is above
# dask's default 70 % / 80 % thresholds of a small limit, so a worker paused for good (the job
# stalled at 300 MB) or evicted every result as soon as it was stored (the job ran 5x slower).
SPILL_TARGET = 0.1
# glibc returns freed heap memory to the OS above this many bytes; a dask nanny sets it for its
# worker, and start_dask's workers run without one
MALLOC_TRIM_THRESHOLD = 65536


def dask_worker_env() -> dict[str, str]:
    """Environment variables for every colaflow ``dask worker`` (with or without a memory limit):
    ``MALLOC_TRIM_THRESHOLD_`` (see :data:`MALLOC_TRIM_THRESHOLD`) and dask's statistical
    profiler off. The profiler samples the running task every 10 ms and keeps a call tree per
    second of the last 1,000 (``distributed.admin.low-level-log-length``) and per task prefix:
    with Beam's deep stacks a worker's own memory then grew with the job's duration (about
    10 MB more per worker at 16× the demo corpus, ``BENCHMARKS.md``). The dashboard's profile
    page stays empty."""
    return {"MALLOC_TRIM_THRESHOLD_": str(MALLOC_TRIM_THRESHOLD),
            "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}


def dask_spill_env(target: float = SPILL_TARGET) -> dict[str, str]:
    """Environment variables (dask's config names) that make a ``dask worker`` started with
    ``--memory-limit`` spill its stored results to local disk beyond ``target`` of the limit
    (a fraction, 0..1), and never spill on measured process memory, pause, nor (under a nanny)
    restart at 95 % of the limit: the limit sizes what is kept in memory, it is not a hard cap.
    Also ``PYTHONMALLOC=malloc``, with which the runner's :class:`pipelines.runners.dask.trim.TrimMemory`
    returns what each task freed to the OS (about a fifth more CPU; see that module)."""
    return {"PYTHONMALLOC": "malloc", "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": str(target),
            "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False",
            "DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "False",
            "DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE": "False"}


def start_dask(log_dir: str | Path, workers: int = 2, env: dict | None = None, timeout_s: float = 60.0,
               memory_limit: str = "0", preload: str | None = None) -> Engine:
    """A ``dask scheduler`` and ``workers`` single-threaded ``dask worker`` processes (no nanny, so
    each worker is one process, with :func:`dask_worker_env`) on 127.0.0.1; returns once all
    workers have registered.

    ``memory_limit`` is each worker's ``--memory-limit`` (e.g. ``"500MB"``); with a limit the
    workers get :func:`dask_spill_env` (results beyond ``SPILL_TARGET`` of the limit are spilled
    to ``log_dir/worker-N.spill``); ``"0"``: no limit, nothing spilled. ``preload``: a module each
    worker imports at start (``dask worker --preload``), e.g. :mod:`tests.support.split_faults`.

    ``env`` is the processes' environment (default: this one); they need colaflow importable.
    Raises ``TimeoutError`` (and stops what started) when the workers do not register in time.
    """
    from distributed import Client

    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    address = f"tcp://127.0.0.1:{free_port()}"
    logs = [log_dir / "scheduler.log"] + [log_dir / f"worker-{i}.log" for i in range(workers)]
    procs = [_spawn([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                     address.rsplit(":", 1)[1], "--no-dashboard", "--no-show"], logs[0], env)]
    procs += [start_dask_worker(address, log, env, memory_limit, preload) for log in logs[1:]]
    engine = Engine(address, procs, logs)
    try:
        with Client(address, timeout=timeout_s) as client:
            client.wait_for_workers(workers, timeout=timeout_s)
    except Exception as e:
        engine.stop()
        raise TimeoutError(f"dask cluster did not start in {timeout_s:.0f} s: {e}; logs in {log_dir}") from e
    return engine


def start_dask_worker(address: str, log: Path, env: dict | None = None, memory_limit: str = "0",
                      preload: str | None = None) -> subprocess.Popen:
    """One single-threaded ``dask worker`` process (no nanny) on 127.0.0.1 for the scheduler at
    ``address``, with :func:`dask_worker_env` (and :func:`dask_spill_env` when ``memory_limit``,
    its ``--memory-limit``, is not ``"0"``; spilled results go to ``log`` with suffix ``.spill``);
    its output goes to the file ``log``. ``env``: its environment (default: this one); ``preload``: a
    module it imports at start (``--preload``). Returns at once, before the worker has registered."""
    worker_env = dict(os.environ if env is None else env, **dask_worker_env())
    if memory_limit != "0":
        worker_env.update(dask_spill_env())
    return _spawn([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                   "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", memory_limit,
                   "--local-directory", str(log.with_suffix(".spill")),
                   *(["--preload", preload] if preload else [])], log, worker_env)


def start_worker_pool(log_dir: str | Path, python: list[str], boot: str, env: dict | None = None,
                      timeout_s: float = 30.0) -> Engine:
    """A Beam external worker pool (``apache_beam.runners.worker.worker_pool_main``) run by the
    interpreter command ``python`` (e.g. ``[sys.executable]``), whose SDK workers are started by the
    executable ``boot`` (``--container_executable``, e.g. :mod:`pipelines.runners.worker_boot`'s file).
    Address for ``--environment_config``: ``Engine.address``. Raises ``TimeoutError`` when the
    pool does not listen in time."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = log_dir / "worker-pool.log"
    proc = _spawn(python + ["-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}",
                            f"--container_executable={boot}"], log, env)
    engine = Engine(f"127.0.0.1:{port}", [proc], [log])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return engine
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    engine.stop()
    raise TimeoutError(f"worker pool did not listen on port {port}: {log.read_text(errors='replace')[-2000:]}")


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of a live process in bytes (``VmHWM`` of ``/proc/PID/status``; Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no VmHWM for process {pid}")


def child_env(**extra: str) -> dict:
    """This process's environment plus ``extra``, with the repository root first on ``PYTHONPATH``."""
    env = dict(os.environ, **extra)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env
