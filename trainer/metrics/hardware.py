"""Hardware metrics of this process's device, read on the host at log steps (no device sync).

On an NVIDIA GPU through NVML (``nvidia-ml-py``, the ``pynvml`` module): utilisation (%), memory
used/total (bytes), power (W), temperature (°C) and SM clock (MHz) of the GPU this rank runs on,
plus the CUDA caching allocator's allocated, reserved and reserved-but-unused (fragmentation)
bytes. Without a GPU (or without NVML): the process's resident set size (bytes) from
``/proc/self/statm``.
"""
from __future__ import annotations

import logging
import os
import resource
import sys

import torch

from trainer.memory import fragmentation_bytes

log = logging.getLogger(__name__)


def rss_bytes() -> tuple[int, str]:
    """``(bytes, kind)``: this process's resident set size (``kind="rss"``, ``/proc/self/statm``), or
    its peak RSS from ``getrusage`` where that file is missing (``kind="rss_peak"``)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "rss"
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return int(peak if sys.platform == "darwin" else peak * 1024), "rss_peak"


def _nvml_handle(device: torch.device):
    """NVML handle of ``device`` found by PCI bus id (CUDA and NVML number GPUs differently when
    ``CUDA_VISIBLE_DEVICES`` is set), or ``None`` when NVML is missing or fails (logged once)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        props = torch.cuda.get_device_properties(device)
        bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"  # NVML's busId format
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    except Exception as e:  # noqa: BLE001 - NVML absent or unusable: the run goes on with allocator metrics
        log.warning("NVML unavailable (%s: %s): no GPU utilisation/power/temperature metrics "
                    "(pip install nvidia-ml-py, or set metrics.hardware=false)", type(e).__name__, e)
        return None


class HardwareMonitor:
    """Samples hardware metrics for one rank's device.

    Args:
        device: this rank's device; NVML is used when it is CUDA.
        enabled: ``False`` makes :meth:`sample` return ``{}``.
    """

    def __init__(self, device: torch.device, enabled: bool = True):
        self.device, self.enabled = device, enabled
        self._nvml = _nvml_handle(device) if enabled and device.type == "cuda" else None

    def sample(self) -> dict[str, float]:
        """Current values, keys prefixed ``hw_``: ``hw_rss_bytes`` always; on CUDA
        ``hw_cuda_allocated_bytes``, ``hw_cuda_reserved_bytes``, ``hw_cuda_fragmentation_bytes``
        (reserved - allocated: cached but unused, :func:`trainer.memory.fragmentation_bytes`); with
        NVML ``hw_gpu_util_pct``, ``hw_gpu_memory_used_bytes``, ``hw_gpu_memory_total_bytes``,
        ``hw_gpu_power_w``, ``hw_gpu_temperature_c``, ``hw_gpu_sm_clock_mhz``. A failing NVML query
        leaves its key out."""
        if not self.enabled:
            return {}
        out: dict[str, float] = {"hw_rss_bytes": float(rss_bytes()[0])}
        if self.device.type == "cuda":
            out["hw_cuda_allocated_bytes"] = float(torch.cuda.memory_allocated(self.device))
            out["hw_cuda_reserved_bytes"] = float(torch.cuda.memory_reserved(self.device))
            out["hw_cuda_fragmentation_bytes"] = float(fragmentation_bytes(self.device))
        if self._nvml is not None:
            import pynvml
            h = self._nvml
            queries = {
                "hw_gpu_util_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                "hw_gpu_memory_used_bytes": lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used,
                "hw_gpu_memory_total_bytes": lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total,
                "hw_gpu_power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "hw_gpu_temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                "hw_gpu_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            }
            for key, query in queries.items():
                try:
                    out[key] = float(query())
                except pynvml.NVMLError:  # e.g. power readings unsupported on this board
                    continue
        return out
