"""Live per-step metrics: interval meter, step-time split, MFU, hardware, per-layer statistics, sinks, profiler."""
