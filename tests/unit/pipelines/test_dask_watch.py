"""A Dask job whose last worker died says so on stderr and keeps waiting: a real ``dask scheduler``
and ``dask worker`` on 127.0.0.1, the worker killed while the job's task runs, a new worker
started after the warning, and the job then finishes."""
from __future__ import annotations

import os
import sys
import threading
import time

import apache_beam as beam
import cloudpickle
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

pytest.importorskip("distributed")
from pipelines.runners.dask import watch as dask_watch  # noqa: E402
from pipelines.runners.dask.watch import completed_watching_workers  # noqa: E402
from pipelines.runners.dask.runner import ColaflowDaskRunner  # noqa: E402
from tests.support.local_engines import child_env, start_dask, start_dask_worker  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module

DEADLINE_S = 120  # a bound on each wait below, so a broken runner fails the test instead of hanging it


def _block(x, started: str, release: str):
    """Mark that the task runs, then hold it until the test releases it."""
    open(started, "w").close()
    while not os.path.exists(release):
        time.sleep(0.05)
    return x


def _write(x, out: str):
    with open(out, "w") as f:
        f.write(str(x))


def _until(check, what: str):
    end = time.monotonic() + DEADLINE_S
    while not (found := check()):
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.1)
    return found


def test_a_job_with_no_worker_left_says_so_and_waits_for_a_new_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dask_watch, "POLL_S", 0.2)
    monkeypatch.setattr(dask_watch, "NO_WORKER_WARN_S", 0.5)
    monkeypatch.setattr(dask_watch, "NO_WORKER_REPEAT_S", 3600.0)  # once in this test: no spam
    started, release, out = tmp_path / "started", tmp_path / "release", tmp_path / "out"
    engine = start_dask(tmp_path / "logs", workers=1, env=child_env())
    try:
        p = beam.Pipeline(runner=ColaflowDaskRunner(),
                          options=PipelineOptions([f"--dask_client_address={engine.address}"]))
        _ = p | beam.Create([7]) | beam.Map(_block, str(started), str(release)) | beam.Map(_write, str(out))
        result = p.run()
        ended: list = []
        job = threading.Thread(target=lambda: ended.append(result.wait_until_finish()), daemon=True)
        job.start()
        _until(started.exists, "the task to start")
        engine.procs[1].kill()
        engine.procs[1].wait()
        seen: list[str] = []
        _until(lambda: seen.append(capsys.readouterr().err) or "no Dask worker" in "".join(seen), "the warning")
        assert job.is_alive()  # still waiting: a worker may come back
        engine.procs.append(start_dask_worker(engine.address, tmp_path / "logs" / "worker-new.log", child_env()))
        release.touch()
        job.join(DEADLINE_S)
        assert ended == [PipelineState.DONE]
        assert out.read_text() == "7"
    finally:
        engine.stop()
    warnings = [line for line in ("".join(seen) + capsys.readouterr().err).splitlines() if "no Dask worker" in line]
    assert len(warnings) == 1
    assert f"scheduler at {engine.address}" in warnings[0] and f"start `dask worker {engine.address}`" in warnings[0]


def test_each_future_leaves_the_set_as_it_completes_so_the_cluster_forgets_it(tmp_path):
    """The runner releases a sink partition's result as soon as it is done: a finished result held
    to the end of the job kept every task upstream of it known to its worker. Here one future
    finishes while another is held back; once the caller drops the first, the scheduler has
    forgotten its key while the job still runs."""
    from distributed import Client, LocalCluster

    release = str(tmp_path / "release")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        quick = client.submit(lambda: 1, key="quick")
        slow = client.submit(_block, 2, str(tmp_path / "started"), release, key="slow")
        futures = {quick, slow}
        del quick, slow
        done = completed_watching_workers(client, futures)
        first = next(done)
        assert (first.key, first.result(), len(futures)) == ("quick", 1, 1)
        del first
        _until(lambda: "quick" not in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks)),
               "the scheduler to forget the finished future")
        assert "slow" in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.tasks))
        open(release, "w").close()
        assert [f.result() for f in done] == [2] and futures == set()
