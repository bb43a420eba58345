#!/usr/bin/env python3
"""Boot of a Beam SDK worker started by an external worker pool: what Beam's container boot does.

An external worker pool (``python -m apache_beam.runners.worker.worker_pool_main
--service_port=50000 --container_executable=/path/to/worker_boot.py``, pipelines run with
``--environment_type=EXTERNAL --environment_config=HOST:50000``) starts this executable once per
SDK worker with ``--id``, ``--provision_endpoint``, ``--artifact_endpoint``,
``--logging_endpoint`` and ``--control_endpoint`` (the Beam SDK container contract). Without it,
the pool runs workers that neither install ``--extra_package`` nor load the pipeline options.

Steps (as ``sdks/python/container/boot.go`` of Apache Beam):

1. ask the provision service for the job's provision info (pipeline options, artifacts);
2. fetch every staged artifact from the artifact service into ``BOOT_DIR/<worker id>/staged``;
3. ``pip install`` the packages listed in ``extra_packages.txt`` (and ``requirements.txt``) into
   ``BOOT_DIR/<worker id>/site``, skipping requirements already satisfied in this environment
   (so a worker image with the dependencies installs only the staged package);
4. run ``apache_beam.runners.worker.sdk_worker_main`` with that folder first on ``PYTHONPATH`` and
   ``PIPELINE_OPTIONS``, ``CONTROL_API_SERVICE_DESCRIPTOR``, ``LOGGING_API_SERVICE_DESCRIPTOR``,
   ``SEMI_PERSISTENT_DIRECTORY`` and ``WORKER_ID`` set.

``BOOT_DIR`` is ``$COLAFLOW_BOOT_DIR`` or ``<tmp>/colaflow-beam-boot``. This file imports only
Apache Beam (and pip), never colaflow: it runs before colaflow is installed. Exit status: the SDK
worker's; 1 with a one-line message when provisioning or installation fails.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from importlib import metadata

import grpc
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
    beam_runner_api_pb2,
    endpoints_pb2,
)
from google.protobuf import json_format, text_format

EXTRA_PACKAGES_FILE = "extra_packages.txt"  # names written by Beam's stager
REQUIREMENTS_FILE = "requirements.txt"


def provision_info(endpoint: str, worker_id: str):
    """The job's ``ProvisionInfo`` proto from the provision service at ``endpoint``."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
        return stub.GetProvisionInfo(beam_provision_api_pb2.GetProvisionInfoRequest(),
                                     metadata=[("worker_id", worker_id)]).info


def fetch_artifacts(endpoint: str, worker_id: str, dependencies, dest: str) -> list[str]:
    """Write each staged artifact (role ``staging_to``) to ``dest/<staged name>``; returns the names."""
    os.makedirs(dest, exist_ok=True)
    names = []
    with grpc.insecure_channel(endpoint) as channel:
        stub = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
        for dep in dependencies:
            if dep.role_urn != common_urns.artifact_roles.STAGING_TO.urn:
                continue
            name = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(dep.role_payload).staged_name
            with open(os.path.join(dest, name), "wb") as f:
                for chunk in stub.GetArtifact(beam_artifact_api_pb2.GetArtifactRequest(artifact=dep),
                                              metadata=[("worker_id", worker_id)]):
                    f.write(chunk.data)
            names.append(name)
    return names


def _missing(requirements: list[str]) -> list[str]:
    from pip._vendor.packaging.requirements import Requirement  # pip is always there to install with

    out = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            if req.specifier.contains(metadata.version(req.name), prereleases=True):
                continue
        except metadata.PackageNotFoundError:
            pass
        out.append(line)
    return out


def install(staged: str, names: list[str], site: str) -> None:
    """``pip install`` the staged extra packages (and ``requirements.txt``) into ``site``; a package's
    dependencies already satisfied in this environment are not installed again."""
    pip = [sys.executable] + (["-S"] if sys.flags.no_site else []) + [
        "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts", "--root-user-action=ignore",
        "--target", site]
    if REQUIREMENTS_FILE in names:
        with open(os.path.join(staged, REQUIREMENTS_FILE), encoding="utf-8") as f:
            wanted = _missing([r.strip() for r in f if r.strip() and not r.startswith("#")])
        if wanted:
            subprocess.run(pip + wanted, check=True)
    if EXTRA_PACKAGES_FILE not in names:
        return
    with open(os.path.join(staged, EXTRA_PACKAGES_FILE), encoding="utf-8") as f:
        packages = [os.path.join(staged, line.strip()) for line in f if line.strip()]
    subprocess.run(pip + ["--no-deps"] + packages, check=True)
    for package in packages:
        dist = next(metadata.distributions(path=[site], name=_dist_name(package)), None)
        wanted = _missing(dist.requires or []) if dist else []
        if wanted:
            subprocess.run(pip + wanted, check=True)


def _dist_name(path: str) -> str:
    return os.path.basename(path).split("-")[0]


def worker_env(info, args, site: str, semi_persistent: str) -> dict:
    """Environment of the SDK worker process (the variables ``sdk_worker_main`` reads)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PIPELINE_OPTIONS"] = json_format.MessageToJson(info.pipeline_options)
    env["WORKER_ID"] = args.id
    env["SEMI_PERSISTENT_DIRECTORY"] = semi_persistent
    for var, url in (("CONTROL_API_SERVICE_DESCRIPTOR", info.control_endpoint.url or args.control_endpoint),
                     ("LOGGING_API_SERVICE_DESCRIPTOR", info.logging_endpoint.url or args.logging_endpoint)):
        env[var] = text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))
    env["RUNNER_CAPABILITIES"] = " ".join(info.runner_capabilities)
    return env


def main(argv: list[str] | None = None) -> int:
    """Boot one SDK worker (the ``--container_executable`` of ``worker_pool_main``): install the staged
    wheel and missing requirements, then run the worker with the job's options. Returns its exit code."""
    ap = argparse.ArgumentParser(prog="python -m pipelines.runners.worker_boot", description="Boot a Beam SDK worker for an external worker pool.")
    for flag in ("id", "provision_endpoint", "artifact_endpoint", "logging_endpoint", "control_endpoint"):
        ap.add_argument(f"--{flag}", required=flag in ("id", "provision_endpoint", "artifact_endpoint"))
    ap.add_argument("--semi_persistent_directory", default=None)
    args, _ = ap.parse_known_args(argv)
    root = os.path.join(os.environ.get("COLAFLOW_BOOT_DIR") or os.path.join(tempfile.gettempdir(),
                                                                            "colaflow-beam-boot"), args.id)
    try:
        info = provision_info(args.provision_endpoint, args.id)
        staged = os.path.join(root, "staged")
        names = fetch_artifacts(args.artifact_endpoint, args.id, info.dependencies, staged)
        site = os.path.join(root, "site")
        install(staged, names, site)
    except (grpc.RpcError, OSError, subprocess.CalledProcessError) as e:
        print(f"worker_boot: provisioning worker {args.id} failed: {e}", file=sys.stderr)
        return 1
    env = worker_env(info, args, site, args.semi_persistent_directory or os.path.join(root, "semi_persistent"))
    cmd = [sys.executable] + (["-S"] if sys.flags.no_site else []) + ["-m", "apache_beam.runners.worker.sdk_worker_main"]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    # no colaflow import here: this boot runs before the staged colaflow wheel is installed
    sys.exit(main())
