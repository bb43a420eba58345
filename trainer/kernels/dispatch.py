"""Choose between the Triton kernels and the PyTorch implementations.

Backends (argument ``backend=`` of every public kernel, else env var ``COLAFLOW_KERNELS``):

- ``"auto"`` (default): Triton when the input is on CUDA and ``triton`` imports, else PyTorch
  (for the linear cross-entropy that is the chunked PyTorch implementation, not the eager one).
- ``"triton"``: force the Triton kernels. Needs CUDA tensors, or ``TRITON_INTERPRET=1`` set before
  the first Triton call (the Triton interpreter then runs them on CPU tensors; slow, for tests).
- ``"torch"``: the fused/chunked PyTorch implementation (same as ``"reference"`` for the norms).
- ``"reference"``: the plain eager PyTorch formula (``reference.py``), the parity baseline.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

BACKENDS = ("auto", "triton", "torch", "reference")
ENV_VAR = "COLAFLOW_KERNELS"


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when the ``triton`` package can be imported (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels run on CPU tensors through the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def requested_backend(backend: str | None) -> str:
    """The backend asked for: ``backend`` if given, else ``$COLAFLOW_KERNELS``, else ``"auto"``.

    Raises:
        ValueError: the name is not one of ``BACKENDS``.
    """
    name = (backend if backend is not None else os.environ.get(ENV_VAR, "auto")).strip().lower()
    if name not in BACKENDS:
        source = "backend argument" if backend is not None else f"${ENV_VAR}"
        raise ValueError(f"{source}={name!r} is not a kernel backend; use one of {BACKENDS}")
    return name


def resolve_backend(backend: str | None, tensor: torch.Tensor, triton_ok: bool = True) -> str:
    """Resolve ``backend`` to ``"triton"``, ``"torch"`` or ``"reference"`` for ``tensor``.

    Args:
        backend: a name from ``BACKENDS`` or None (read ``$COLAFLOW_KERNELS``).
        tensor: the main input; its device decides ``"auto"``.
        triton_ok: False when the Triton kernel cannot handle this shape (``"auto"`` then
            falls back to PyTorch; forcing ``"triton"`` raises).

    Raises:
        ValueError: unknown backend name, or ``"triton"`` forced on a shape it cannot handle.
        RuntimeError: ``"triton"`` forced but triton is not installed, or the tensor is on CPU
            without ``TRITON_INTERPRET=1``.
    """
    name = requested_backend(backend)
    if name == "auto":
        use = tensor.is_cuda and triton_available() and triton_ok
        return "triton" if use else "torch"
    if name == "triton":
        if not triton_available():
            raise RuntimeError("kernel backend 'triton' was forced but triton is not installed; "
                               "run `pip install triton` or set COLAFLOW_KERNELS=auto")
        if not tensor.is_cuda and not triton_interpreting():
            raise RuntimeError(f"kernel backend 'triton' needs CUDA tensors (got {tensor.device}); "
                               "set TRITON_INTERPRET=1 to run it on CPU, or COLAFLOW_KERNELS=auto")
        if not triton_ok:
            raise ValueError(f"the Triton kernel cannot handle input shape {tuple(tensor.shape)}; "
                             "use COLAFLOW_KERNELS=auto or torch")
    return name
