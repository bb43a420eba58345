"""Seeing inside a run: per-interval metrics (:mod:`.meter`), step-time split (:mod:`.timing`),
FLOPs and MFU (:mod:`.mfu`), metric sinks (:mod:`.metrics`: tqdm, JSONL, TensorBoard,
Prometheus), the ``torch.profiler`` window (:mod:`.profiling`) and the HTML run report
(:mod:`.report`)."""
