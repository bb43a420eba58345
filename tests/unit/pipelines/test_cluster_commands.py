"""The cluster command lines in README.md and docs/cluster.md use only flags Beam knows.

Flink, Spark and Dataflow cannot run here, so each documented ``colaflow preprocess ...`` or
``python beam_runner.py ...`` line (its alias) is split the way ``beam_runner.py`` splits it, and
every Beam flag must be a registered pipeline option (a typo such as ``--flink-master`` would
otherwise only fail on the cluster).
"""
import os
import re
import shlex

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dask import dask_runner  # noqa: F401  registers the --dask_* options

import beam_runner
from tests.support.paths import REPO

ROOT = str(REPO)
PREPROCESS = ("colaflow preprocess", "python beam_runner.py")  # two words, then beam_runner's arguments


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for doc in ("README.md", os.path.join("docs", "cluster.md")):
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            found += [(doc, line.strip()) for line in joined.splitlines()
                      if line.strip().startswith(PREPROCESS) and "[" not in line]
    return found


COMMANDS = documented_commands()


def test_docs_show_cluster_runners():
    runners = {m for _, c in COMMANDS for m in re.findall(r"--runner=(\w+)", c)}
    assert {"FlinkRunner", "SparkRunner", "DataflowRunner", "PortableRunner", "DaskRunner"} <= runners, runners


@pytest.mark.parametrize("doc,command", COMMANDS)
def test_documented_command_uses_known_flags(doc, command):
    args, overrides, beam_args = beam_runner.split_args(shlex.split(command)[2:])
    assert args.input and args.output
    assert all("=" in o for o in overrides)
    options = PipelineOptions(beam_args)
    known = options.get_all_options(retain_unknown_options=False)
    unknown = set(options.get_all_options(retain_unknown_options=True)) - set(known)
    assert not unknown, f"{doc}: not Beam pipeline options: {sorted(unknown)} (in: {command})"
    assert known["runner"] is None or known["runner"].endswith("Runner")
