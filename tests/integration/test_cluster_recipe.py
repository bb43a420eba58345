"""docs/cluster.md's multi-node launch line, run as 2 "nodes" of 1 rank on this machine: two torchrun
agents meet through the c10d rendezvous on 127.0.0.1, each with its own cache folder, and train a
few steps from shards served over HTTP. Each node downloads only shards of its own: the two caches
hold disjoint shards, each of its node's deal (loaders.order.split), so the nodes read disjoint
documents."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from loaders.order.sample_order import SampleOrder
from loaders.order.split import plan_nodes
from shards import Manifest
from tests.support.data import write_counting_shards
from tests.support.http_server import serve_directory
from tests.support.paths import REPO
from trainer.distributed.parallel import free_port

TINY = ["model.vocab_size=64", "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0", "data.pack_window=64",
        "data.shuffle_block=16", "steps=2", "log_every=1", "zero.stage=0", "precision=fp32", "device=cpu",
        "metrics.progress=false", "eval.every=0", "cache.prefetch_shards=1", "checkpoint.save_at_end=false"]


def launch_line() -> str:
    """The command under docs/cluster.md's ``launch-line`` marker."""
    text = (REPO / "docs" / "cluster.md").read_text()
    m = re.search(r"<!-- launch-line:[^>]*-->\s*```bash\n(.+?)\n```", text, re.S)
    assert m, "docs/cluster.md lost its launch-line block"
    return m.group(1).strip()


def test_two_nodes_from_the_recipe_read_disjoint_shards(tmp_path):
    data = tmp_path / "shards"
    write_counting_shards(str(data), 160, max_samples=10, vocab=64, max_len=30)
    server, base = serve_directory(str(data))
    port = free_port()
    agents = []
    try:
        for node in range(2):
            values = {"NNODES": "2", "GPUS_PER_NODE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                      "JOB_ID": "recipe", "CONFIG": str(REPO / "configs" / "demo.yaml"),
                      "DATA": f"{base}/manifest.json", "CACHE_DIR": str(tmp_path / f"cache{node}"),
                      "RUN_DIR": str(tmp_path / "run")}
            line = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], launch_line())
            argv = shlex.split(line)
            assert argv[0] == "torchrun"
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
            for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "COLAFLOW_CACHE_DIR"):
                env.pop(var, None)
            agents.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *argv[1:], *TINY],
                                           cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True))
        outputs = [a.communicate(timeout=240)[0] for a in agents]
        for a, out in zip(agents, outputs):
            assert a.returncode == 0, out[-4000:]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        server.stop()
    cached = [{name.split("-", 1)[1] for name in os.listdir(tmp_path / f"cache{k}" / "data")
               if not name.endswith(".meta")} for k in range(2)]
    assert cached[0] and cached[1] and not cached[0] & cached[1], cached
    # and each holds shards of its own node's deal (configs/demo.yaml: data.seed 0; the line: 64 lanes)
    manifest = Manifest.load(str(data))
    order = SampleOrder(manifest.document_counts(), 0, 0, block=16, lanes=64)
    plan = plan_nodes(order, 2, 2)
    for k in range(2):
        assert cached[k] <= {manifest.shards[s].name for s in plan.shards(order, k)}, (k, cached[k])


def test_the_slurm_script_runs_the_tested_launch_line():
    """docs/cluster.md's sbatch script starts the launch line tested above, with every variable it uses exported."""
    text = (REPO / "docs" / "cluster.md").read_text()
    m = re.search(r"## Slurm\s*```bash\n(.+?)\n```", text, re.S)
    assert m, "docs/cluster.md lost its Slurm script"
    script = m.group(1).replace("\\\n", " ")
    command = re.search(r"bash -c '(.+?)'", script)
    assert command and command.group(1).split() == launch_line().split()
    exported = {name for line in script.splitlines() if line.startswith("export ")
                for name in re.findall(r"\b([A-Z_]+)=", line)}
    assert set(re.findall(r"\$(\w+)", launch_line())) <= exported
