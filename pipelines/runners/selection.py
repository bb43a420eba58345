"""Which Beam runner a run uses: the ``--runner`` and other Beam flags checked up front
(:func:`beam_options`), and the runner instance for them (:func:`make_runner`)."""
from __future__ import annotations

import argparse
import difflib
import importlib

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.runners.runner import PipelineRunner

from colaflow.config import ConfigError
from colaflow.wording import plural

# Beam's own DaskRunner mistranslates the job (pipelines/runners/dask/runner.py); these names get ours
DASK_RUNNER_NAMES = ("DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner")
# what docs/cluster.md shows the job running on; other Beam runners are refused (a dotted class path is not)
SUPPORTED_RUNNERS = ("DirectRunner", "DaskRunner", "PortableRunner", "PrismRunner", "FlinkRunner", "SparkRunner",
                     "DataflowRunner")


def beam_options(beam_args: list[str]) -> PipelineOptions:
    """Beam's ``PipelineOptions`` for ``beam_args``, refusing any ``--flag`` that no registered
    ``PipelineOptions`` subclass declares (Beam itself drops them silently, so ``--runer=DataflowRunner``
    would quietly run locally). The ``--runner`` is checked and normalised (:func:`check_runner`:
    ``--runner=dask`` becomes ``DaskRunner``); the Dask runner's options are registered when it is
    chosen, and refused with a hint to choose it otherwise.

    Raises:
        colaflow.config.ConfigError: an unknown flag; the message names it and the closest known option,
            or says that a Dask option needs ``--runner=DaskRunner``. Or a ``--runner`` colaflow does not
            run on (:func:`check_runner`).
    """
    options = PipelineOptions(beam_args)
    standard = options.view_as(StandardOptions)
    standard.runner = check_runner(standard.runner)
    if standard.runner == "DaskRunner":
        from pipelines.runners.dask.runner import ColaflowDaskRunner  # noqa: F401 - declares the DaskOptions
    given = {a[2:].split("=", 1)[0] for a in beam_args if a.startswith("--")}
    dask_only = sorted(given & _dask_flags()) if given and standard.runner != "DaskRunner" else []
    if dask_only:  # declared once the Dask runner was imported in this process, yet meaningless here
        raise ConfigError(f"{' '.join('--' + f for f in dask_only)} {plural(len(dask_only), 'is a', 'are')} "
                          f"DaskRunner {plural(len(dask_only), 'option')}; add --runner=DaskRunner to run on Dask "
                          "(see docs/cluster.md)")
    known = set(PipelineOptions([]).get_all_options())  # after _dask_flags, which registers the DaskOptions
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean --{close[0]}? " if close else ""
        raise ConfigError(f"unknown {plural(len(unknown), 'option')} {' '.join('--' + u for u in unknown)}: "
                          f"neither a colaflow flag nor a Beam pipeline option; {hint}see --help and Beam's "
                          "PipelineOptions")
    return options


def _dask_flags() -> set[str]:
    """Flag names (without ``--``) that Beam's ``DaskOptions`` declares; empty without dask installed."""
    try:
        from apache_beam.runners.dask.dask_runner import DaskOptions
    except ImportError:
        return set()
    parser = argparse.ArgumentParser()
    DaskOptions._add_argparse_args(parser)  # how every PipelineOptions subclass declares its flags
    return {flag[2:] for action in parser._actions for flag in action.option_strings if flag.startswith("--")}


def check_runner(name: str | None) -> str | None:
    """The ``--runner`` value as colaflow and Beam should see it, refusing up front one that would
    fail only once the run starts (Beam's own error comes mid-run and lists runners colaflow cannot
    use, without colaflow's ``DaskRunner``).

    Accepted: ``None`` (the DirectRunner, returned as ``None``); a name of :data:`SUPPORTED_RUNNERS`,
    case-insensitive with the ``Runner`` suffix optional as ``apache_beam.runners.runner.create_runner``
    reads it (``dask`` → ``"DaskRunner"``); a name of :data:`DASK_RUNNER_NAMES` (→ ``"DaskRunner"``);
    or the dotted path of an importable ``apache_beam.runners.runner.PipelineRunner`` subclass, which,
    when Beam defines it, must be one of :data:`SUPPORTED_RUNNERS` or derive from one (returned
    as given, or as ``"DirectRunner"`` for Beam's DirectRunner and ``"DaskRunner"`` for its DaskRunner or a
    subclass, so colaflow's own runner setup applies).

    Raises:
        colaflow.config.ConfigError: an unknown name (the message lists :data:`SUPPORTED_RUNNERS` and the
            closest of them, by ``difflib``), a Beam runner colaflow does not support (by name or
            dotted path), or a dotted path
            that does not import or is not a ``PipelineRunner`` class.
    """
    if name is None:
        return None
    if name in DASK_RUNNER_NAMES:
        return "DaskRunner"
    supported = ", ".join(SUPPORTED_RUNNERS)
    if "." in name:
        return _runner_class(name, supported)
    for known in SUPPORTED_RUNNERS:
        if name.lower() in (known.lower(), known.lower()[:-len("runner")]):
            return known
    beam_names = {path.rsplit(".", 1)[-1].lower() for path in StandardOptions.ALL_KNOWN_RUNNERS}
    if name.lower() in beam_names or name.lower() + "runner" in beam_names:
        raise ConfigError(f"--runner={name}: a Beam runner colaflow does not support; use one of {supported} "
                          "(see docs/cluster.md)")
    close = difflib.get_close_matches(name, SUPPORTED_RUNNERS, n=1, cutoff=0.5)
    hint = f"did you mean --runner={close[0]}? " if close else ""
    raise ConfigError(f"unknown runner --runner={name}: {hint}colaflow runs on {supported} "
                      "(see docs/cluster.md), or give the dotted path of a PipelineRunner class")


def _runner_class(path: str, supported: str) -> str:
    """Check that ``path`` (``module.Class``) imports to a ``PipelineRunner`` subclass and, for a
    class defined in ``apache_beam``, that it is one of :data:`SUPPORTED_RUNNERS` or a subclass of
    one (``...direct_runner.BundleBasedDirectRunner`` is refused as ``BundleBasedDirectRunner``
    is); returns the name :func:`check_runner` documents. Raises ``ConfigError`` (one line) otherwise."""
    module, attr = path.rsplit(".", 1)
    fix = f"give the dotted path of a PipelineRunner class, or one of {supported}"
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise ConfigError(f"--runner={path}: cannot import {module} ({e}); {fix}") from e
    except AttributeError as e:
        raise ConfigError(f"--runner={path}: module {module} has no {attr}; {fix}") from e
    if not (isinstance(cls, type) and issubclass(cls, PipelineRunner)):
        raise ConfigError(f"--runner={path}: {type(cls).__name__} {attr} is not a PipelineRunner class; {fix}")
    # Beam's own runners are held to the list by dotted path as by name (Beam's DirectRunner is
    # an alias of its SwitchingDirectRunner, hence the identity test)
    if cls.__module__.startswith("apache_beam.") and not issubclass(cls, DirectRunner) and not any(
            c.__module__.startswith("apache_beam.") and c.__name__ in SUPPORTED_RUNNERS for c in cls.__mro__):
        raise ConfigError(f"--runner={path}: a Beam runner colaflow does not support; use one of {supported} "
                          "(see docs/cluster.md)")
    if cls is DirectRunner:
        return "DirectRunner"
    dask = any(f"{c.__module__}.{c.__qualname__}" in DASK_RUNNER_NAMES for c in cls.__mro__)
    return "DaskRunner" if dask else path  # ours fixes how Beam's DaskRunner translates the job




def make_runner(options: PipelineOptions, input_bytes: int = 0) -> PipelineRunner | None:
    """The runner to pass to ``beam.Pipeline`` for ``options`` (normalised by :func:`beam_options`):
    for the DirectRunner (``--runner`` unset or ``DirectRunner``) one marked interactive, which
    skips Prism (a binary Beam's DirectRunner otherwise downloads from GitHub at run time), so runs
    are offline and the same everywhere; for ``DaskRunner``
    :class:`pipelines.runners.dask.runner.ColaflowDaskRunner` (``input_bytes``: total size of the
    input files, which sizes its partitions); else ``None`` (Beam builds the runner ``--runner`` names).

    Raises:
        ImportError: ``DaskRunner`` without dask installed (``colaflow[dask]``).
    """
    name = options.view_as(StandardOptions).runner
    if name in (None, "DirectRunner"):
        runner = DirectRunner()
        runner.is_interactive()
        return runner
    if name == "DaskRunner":
        from pipelines.runners.dask.runner import ColaflowDaskRunner  # dask is optional (colaflow[dask])

        return ColaflowDaskRunner(input_bytes)
    return None
