"""Shared pytest fixtures (keep small: several test files use these)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import pytest

# `make test` runs one pytest-xdist worker per core: a worker (and every process it starts) that
# also spawns a torch/OpenMP thread per core oversubscribes the machine, which measured twice the
# CPU time for the same tests. Set before torch is imported; a value set outside still wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

# Triton fixes interpreter-or-compiled when a kernel module is first imported; any test may import
# trainer.kernels first, so a CPU-only session runs every Triton kernel through the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A non-interactive shell starts a background job (`make test &`, `nohup ... &`) with Ctrl-C ignored, and
# every process the suite starts would inherit that: the Ctrl-C tests then saw no interrupt at all (their
# child kept running until the test's time-out). Python's own handler is not inherited across exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from tests.support.hf import relink_logs
from tests.support.http_server import serve_directory
from trainer.distributed.parallel import free_port


@pytest.fixture(autouse=True)
def _transformers_logs_to_a_live_stream():
    """Each test's transformers warnings go to the live ``sys.stderr`` (see :func:`tests.support.hf.relink_logs`)."""
    relink_logs()
    yield


@pytest.fixture(autouse=True)
def _root_log_handlers_restored():
    """A command line run in process (``beam_runner.main`` calls ``logging.basicConfig(force=True)``)
    leaves a root handler on that test's ``capsys`` stream; closed after the test, it would print
    ``--- Logging error ---`` into a later test's stderr for every record that reaches the root
    logger (transformers' records do where ``CI`` is set: it then propagates them)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def http_server(tmp_path):
    """A Range-capable HTTP server on 127.0.0.1 serving a fresh folder.

    Yields ``(server, base_url, root)``: put files under ``root`` (a ``pathlib.Path``) and fetch
    ``f"{base_url}/{name}"``. ``server.gets(name)`` lists served GETs; ``server.faults`` scripts
    misbehaviour (see ``tests.support.http_server.Faults``).
    """
    root = tmp_path / "served"
    root.mkdir()
    server, base_url = serve_directory(str(root))
    try:
        yield server, base_url, root
    finally:
        server.stop()


@dataclass
class MotoServer:
    """A running moto S3 server: its ``endpoint`` URL, fsspec ``storage_options`` and the ``AWS_*``
    environment that points boto3/s3fs/Beam at it."""
    proc: subprocess.Popen
    endpoint: str
    storage_options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    def stop(self) -> None:
        """Terminate the server process (waits up to 10 s, then kills it)."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_moto(timeout_s: float = 30.0) -> MotoServer:
    """Start ``moto.server`` on a free 127.0.0.1 port and wait until it answers.

    Raises:
        ModuleNotFoundError: moto is not installed.
        RuntimeError: the server did not answer within ``timeout_s`` seconds.
    """
    import moto.server  # noqa: F401  (fail early and clearly when moto[server] is missing)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto S3 server on {endpoint} did not start")
            time.sleep(0.2)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}
    # no region in client_kwargs: s3fs would send it as a LocationConstraint, which us-east-1 refuses
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}
    return MotoServer(proc, endpoint, opts, env)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API (moto's server, a separate process) on 127.0.0.1 for ``s3://`` tests.

    Yields ``(endpoint_url, storage_options)``: pass ``storage_options`` to fsspec/s3fs, or set the
    ``AWS_*`` variables this fixture exports (so torchrun children and Beam's S3 filesystem find it).
    Create buckets with ``s3fs.S3FileSystem(**storage_options).mkdir("bucket")``. Skips only when
    ``moto[server]`` or ``s3fs`` is not installed (``make install`` installs both).
    """
    pytest.importorskip("s3fs")
    try:
        server = start_moto()
    except ModuleNotFoundError as e:
        pytest.skip(f"moto server not installed: {e}")
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server.endpoint, server.storage_options
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


# The slowest test files of `make test` (measured with --durations on 2 cores), slowest first. They are
# collected first so that xdist (`--dist worksteal`, see the Makefile) starts them at once and the run ends
# on short tests spread over both workers, not on a 70 s test that one worker picked up last. Whole files
# move, in their own order, so a module-scoped fixture is still built once per file and worker.
SLOW_FILES_FIRST = (
    "tests/integration/test_demo.py",
    "tests/integration/test_stages_demo.py",
    "tests/unit/trainer/test_run_folder.py",
    "tests/unit/pipelines/test_engines.py",
    "tests/unit/pipelines/test_pipeline.py",
    "tests/unit/trainer/test_elastic.py",
    "tests/integration/test_continue_pretraining.py",
    "tests/unit/trainer/test_checkpoint_s3.py",
    "tests/unit/trainer/test_checkpoint_reshard.py",
    "tests/unit/pipelines/test_near_dedup_clusters.py",
    "tests/unit/trainer/test_replay.py",
    "tests/unit/pipelines/test_resume.py",
    "tests/unit/pipelines/test_warc.py",
    "tests/unit/pipelines/test_overwrite.py",
    "tests/unit/pipelines/test_runs.py",
    "tests/unit/pipelines/test_usage.py",
    "tests/unit/trainer/test_zero.py",
    "tests/integration/test_examples.py",
    "tests/integration/test_trainer_e2e.py",
    "tests/integration/test_mixture_train.py",
    "tests/integration/test_own_tokenizer.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Order the items so that :data:`SLOW_FILES_FIRST` come first (stable: the rest keep their order)."""
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))
