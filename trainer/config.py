"""Trainer configuration: the top-level ``TrainConfig`` read from YAML by ``colaflow.config.load_config``.

Every section is a dataclass with defaults that run on a laptop CPU; a YAML file fills some fields
and ``key=value`` overrides on the command line fill others (``optim.lr=1e-3 zero.stage=3``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from cache.config import CacheConfig
from colaflow.config import ConfigError, check_fields, from_dict, setting
from loaders.config import DataConfig
from trainer.choices import ATTENTION_NAMES, NORM_EPS, OFFLOAD_MODES, checkpoint_mode
from trainer.run.hooks import parse_hooks

log = logging.getLogger(__name__)


@dataclass
class ModelConfig:
    """GPT-style decoder sizes (Llama's architecture with ``norm: rmsnorm``).

    Attributes:
        vocab_size: token vocabulary; 0 = take ``vocab_size`` from the data manifest (or from
            ``init_from``).
        d_model: hidden width (must be divisible by ``n_heads``; head dim must be even for RoPE).
        n_layers: transformer blocks.
        n_heads: attention (query) heads.
        n_kv_heads: key/value heads; fewer than ``n_heads`` is grouped-query attention (Ainslie
            et al. 2023, "GQA"), each key/value head serving ``n_heads / n_kv_heads`` query heads;
            must divide ``n_heads``. 0 = ``n_heads`` (multi-head attention).
        ffn_mult: SwiGLU hidden width as a multiple of ``d_model`` (rounded up to a multiple of 8).
        ffn_hidden: SwiGLU hidden width in units; 0 = from ``ffn_mult`` (a pretrained model's
            ``intermediate_size`` is rarely a round multiple).
        max_seq_len: longest position the model is used at (documents restart positions at 0).
        norm: ``rmsnorm`` or ``layernorm``.
        tie_embeddings: share the input embedding with the output projection.
        rope_theta: RoPE base frequency (Su et al. 2021, "RoFormer").
        norm_eps: epsilon inside the norms.
        attention: how attention keeps tokens inside their document (:mod:`trainer.attention`):
            ``auto`` (FlexAttention's block mask on CUDA, the dense ``T x T`` mask on CPU), ``flex``
            or ``dense``; rows of one document take SDPA's causal kernel under each. Not part of
            the architecture (the same weights run under every backend).
        init_from: start a new run at step 0 from these weights, with a fresh optimizer: a Hugging
            Face Llama folder (``config.json`` + safetensors), a ``.pt`` export or a colaflow
            checkpoint folder (:mod:`trainer.pretrained`). Sizes still at their defaults are taken
            from it; sizes set to other values must match it. ``""`` = random initialisation.
    """

    vocab_size: int = setting(0, ge=0)
    d_model: int = setting(128, ge=1)
    n_layers: int = setting(4, ge=1)
    n_heads: int = setting(4, ge=1)
    n_kv_heads: int = setting(0, ge=0)
    ffn_mult: float = setting(2.667, gt=0)
    ffn_hidden: int = setting(0, ge=0)
    max_seq_len: int = setting(256, ge=1)
    norm: str = setting("rmsnorm", choices=("rmsnorm", "layernorm"))
    tie_embeddings: bool = True
    rope_theta: float = setting(10000.0, gt=0)
    norm_eps: float = setting(NORM_EPS, gt=0)
    attention: str = setting("auto", choices=ATTENTION_NAMES)
    init_from: str = ""

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``d_model / n_heads``."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads in use (``n_kv_heads``, or ``n_heads`` when it is 0)."""
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_width(self) -> int:
        """SwiGLU hidden width in use (``ffn_hidden``, or ``ffn_mult * d_model`` rounded up to a multiple of 8)."""
        return self.ffn_hidden or 8 * math.ceil(self.ffn_mult * self.d_model / 8)

    def architecture(self) -> dict:
        """The values that decide the model's tensors and function, resolved (``n_kv_heads`` and the
        SwiGLU width as used; not ``ffn_mult`` or ``init_from``): two configs with equal
        architectures hold the same weights (a checkpoint of one loads into the other)."""
        return {"vocab_size": self.vocab_size, "d_model": self.d_model, "n_layers": self.n_layers,
                "n_heads": self.n_heads, "n_kv_heads": self.kv_heads, "ffn_hidden": self.ffn_width,
                "max_seq_len": self.max_seq_len, "norm": self.norm, "tie_embeddings": self.tie_embeddings,
                "rope_theta": self.rope_theta, "norm_eps": self.norm_eps}

    def validate(self) -> None:
        """Check the declared ranges of ``model.*`` (:func:`colaflow.config.check_fields`) and the
        relations between them; raises ``ValueError`` naming the bad field and what to set."""
        check_fields(self, "model.")
        if self.d_model % self.n_heads or self.head_dim % 2:
            raise ValueError(f"model.d_model={self.d_model} must split into n_heads={self.n_heads} heads of even size")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads} (each "
                             "key/value head serves the same number of query heads)")


@dataclass
class ZeroConfig:
    """Data parallelism and ZeRO stage (Rajbhandari et al. 2020, "ZeRO").

    Attributes:
        stage: 0 = DDP; 1 = DDP + ``ZeroRedundancyOptimizer`` (optimizer state sharded);
            2 = FSDP2 ``fully_shard(reshard_after_forward=False)`` (gradients + optimizer state
            sharded, parameters kept gathered from forward to backward); 3 = FSDP2 ``fully_shard``
            (parameters sharded too).
        forward_prefetch: FSDP blocks all-gathered ahead during forward (0 = FSDP2's default of
            one implicit prefetch).
        backward_prefetch: FSDP blocks all-gathered ahead during backward (0 = default).
        bucket_cap_mb: DDP gradient bucket size in MiB (stages 0/1).
        cpu_offload: stage 3 only: keep the sharded parameters, gradients and optimizer state in
            host memory (FSDP2 ``CPUOffloadPolicy``, pinned on CUDA); each block is copied to the
            device for its forward and backward, and the optimizer steps on the CPU.
    """

    stage: int = setting(0, choices=(0, 1, 2, 3))
    forward_prefetch: int = setting(0, ge=0)
    backward_prefetch: int = setting(0, ge=0)
    bucket_cap_mb: int = setting(25, ge=1)
    cpu_offload: bool = False


@dataclass
class MemoryConfig:
    """Where activations live and how the CUDA allocator grows (:mod:`trainer.memory`).

    Attributes:
        offload_activations: keep the tensors saved for backward in host memory until backward
            needs them (``torch.autograd.graph.save_on_cpu``, pinned on CUDA): ``none``,
            ``blocks`` (inside each transformer block) or ``model`` (the whole forward).
        expandable_segments: on CUDA, set the caching allocator's ``expandable_segments`` before
            the first allocation (less fragmentation; ``$PYTORCH_CUDA_ALLOC_CONF`` wins when it
            says otherwise).
    """

    offload_activations: str = setting("none", choices=OFFLOAD_MODES)
    expandable_segments: bool = True


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay (Loshchilov & Hutter 2017/2019).

    Attributes:
        lr: peak learning rate.
        min_lr: learning rate at the end of the cosine.
        warmup_steps: optimizer steps of linear warmup from 0.
        weight_decay: decoupled weight decay on matrices (not on norms/biases).
        betas: Adam betas.
        grad_clip: max global gradient L2 norm (0 = off).
        grad_accum_steps: micro-batches per optimizer step.
    """

    lr: float = setting(3e-3, gt=0)
    min_lr: float = setting(3e-4, ge=0)
    warmup_steps: int = setting(20, ge=0)
    weight_decay: float = setting(0.1, ge=0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = setting(1.0, ge=0)
    grad_accum_steps: int = setting(1, ge=1)


@dataclass
class CheckpointConfig:
    """``torch.distributed.checkpoint`` settings.

    Every checkpoint is verified after it is written (its stored bytes read back: per-tensor
    checksums, digests of step, loader, trainer and RNG state) and only then becomes visible (see
    :mod:`trainer.checkpointing`).

    Attributes:
        dir: checkpoint root, relative to ``run_dir`` unless absolute, or an fsspec URL
            (``s3://bucket/run/ckpt``, ``gs://...``: written in place, ``COMPLETE`` last; credentials
            from ``AWS_*``/fsspec config).
        every: save a full checkpoint (model, optimizer, step, RNG, loader, scheduler) every N
            optimizer steps (0 = only at the end).
        weights_every: save a weights-only checkpoint (model + step) every N steps (0 = never).
        keep_last: full checkpoints kept (older ones deleted; 0 = keep all). Weights-only
            checkpoints are kept by the same rule, counted separately.
        async_save: write with ``dcp.async_save`` (the state is staged to CPU memory and written
            in a background thread; verification and commit happen at the next save or at the end).
        save_at_end: save after the last step.
        resume: checkpoint folder to resume from, or ``latest``/``""``: the newest finished one
            under ``dir`` when there is one (a run folder with earlier output but no compatible
            checkpoint is refused; see :mod:`trainer.run.folder`).
        overwrite: remove an earlier run's checkpoints, metrics and summary in ``run_dir`` and
            start at step 0 instead of resuming or refusing.
    """

    dir: str = "checkpoints"
    every: int = setting(0, ge=0)
    weights_every: int = setting(0, ge=0)
    keep_last: int = setting(0, ge=0)
    async_save: bool = False
    save_at_end: bool = True
    resume: str = ""
    overwrite: bool = False


@dataclass
class AnomalyConfig:
    """Bad-step handling: non-finite loss/gradients and loss spikes skip the step; repeated bad
    steps roll back to the last good checkpoint with a lower learning rate (see :mod:`trainer.run.anomaly`).

    Attributes:
        enabled: check every step (one 3-value all-reduce and one host read per step).
        spike_ratio: a step whose loss exceeds ``spike_ratio`` x the EMA of past good losses is
            skipped (0 = no spike detection).
        ema_beta: EMA decay of the loss statistic.
        spike_warmup: good steps seen before spikes are detected.
        max_consecutive: bad steps in a row that trigger a rollback (0 = never roll back).
        rollback_lr_factor: the learning rate is multiplied by this at each rollback.
    """

    enabled: bool = True
    spike_ratio: float = setting(4.0, ge=0)
    ema_beta: float = setting(0.9, ge=0, lt=1)
    spike_warmup: int = setting(20, ge=0)
    max_consecutive: int = setting(5, ge=0)
    rollback_lr_factor: float = setting(0.5, gt=0, le=1)


@dataclass
class MetricsConfig:
    """Logging settings (rank 0 writes; see :mod:`trainer.metrics.sinks` and
    :mod:`trainer.metrics.meter`).

    Attributes:
        jsonl: metrics file name inside ``run_dir`` (one JSON object per logged step).
        progress: show a tqdm progress bar on rank 0.
        tensorboard_dir: TensorBoard event folder inside ``run_dir`` (``""`` = no TensorBoard).
        prometheus_port: serve Prometheus metrics on this TCP port on rank 0 (0 = off).
        prometheus_addr: bind address of that endpoint (``0.0.0.0`` to let a cluster scraper in).
        prometheus_linger_s: keep serving the final values this many seconds after the run ends,
            so a scraper whose ``scrape_interval`` is shorter collects them (0 = stop at once).
        peak_flops: peak FLOP/s of one device for MFU (0 = the bf16 data-sheet figure of a known
            GPU; on CPU MFU is then not reported). See :mod:`trainer.metrics.mfu` for the FLOPs formula.
        layer_stats: transformer blocks with per-layer statistics (gradient norm, update-to-weight
            ratio, activation RMS/max; :mod:`trainer.metrics.model_stats`), measured only on
            logged steps: 0 = off, -1 = every block, N = N blocks spread from first to last.
        hardware: add hardware metrics (:mod:`trainer.metrics.hardware`: NVML on a GPU, RSS
            and CUDA allocator bytes otherwise) to each record.
    """

    jsonl: str = "metrics.jsonl"
    progress: bool = True
    tensorboard_dir: str = "tensorboard"
    prometheus_port: int = setting(0, ge=0, le=65535)
    prometheus_addr: str = "127.0.0.1"
    prometheus_linger_s: float = setting(0.0, ge=0)
    peak_flops: float = setting(0.0, ge=0)
    layer_stats: int = setting(2, ge=-1)
    hardware: bool = True


@dataclass
class ProfileConfig:
    """A ``torch.profiler`` trace of a window of steps (:mod:`trainer.metrics.profiling`).

    Attributes:
        enabled: record a trace.
        skip_first: optimizer steps ignored before the window starts (steps count from the
            first step of this process, i.e. from the resume step of a resumed run).
        wait: then steps not profiled.
        warmup: then steps profiled but discarded (profiler start-up cost).
        active: then steps recorded into the trace.
        dir: trace folder inside ``run_dir`` (Chrome trace JSON, one file per rank).
        record_shapes: record operator input shapes.
        profile_memory: record tensor allocations.
        with_stack: record Python stacks (large traces).
    """

    enabled: bool = False
    skip_first: int = setting(0, ge=0)
    wait: int = setting(1, ge=0)
    warmup: int = setting(1, ge=0)
    active: int = setting(2, ge=1)
    dir: str = "profile"
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False


@dataclass
class EvalConfig:
    """Validation loss during training (:mod:`trainer.evaluation`).

    Attributes:
        enabled: evaluate at all (off, or no validation data found: no evaluation, one log line).
        every: evaluate every N optimizer steps, and always after the last step (0 = only at the end).
        tokens: validation token slots (micro-batch rows x ``data.seq_len``) read per evaluation over
            all ranks; the same batches every time, so evaluations compare. Capped by the split's size.
        manifest: validation ``manifest.json`` (path, folder or URL); ``""`` = the ``val`` split
            listed in ``data.manifest`` (written by preprocessing with ``split.val_fraction`` > 0).
        micro_batch_size: rows per validation micro-batch (0 = ``data.micro_batch_size``).
    """

    enabled: bool = True
    every: int = setting(0, ge=0)
    tokens: int = setting(65536, ge=1)
    manifest: str = ""
    micro_batch_size: int = setting(0, ge=0)


@dataclass
class TrainConfig:
    """Everything one training run needs.

    Attributes:
        run_dir: output folder (metrics, checkpoints, summary).
        steps: optimizer steps to run.
        log_every: steps between host syncs for logging (the only host syncs in the loop).
        seed: model-init and dropout seed (the data order seed is ``data.seed``).
        device: ``auto`` (cuda if available), ``cpu`` or ``cuda``.
        precision: ``fp32`` or ``bf16`` (bf16 compute, fp32 master weights and reductions).
        activation_checkpointing: ``none``, ``full`` (keep each block's input, recompute the block in
            backward) or ``selective`` (keep matrix-multiply and attention outputs, recompute the
            rest); ``true``/``false`` mean ``full``/``none`` (:mod:`trainer.memory`).
        compile: ``torch.compile`` each block.
        hooks: step hooks, each ``{target: "package.module:Class", args: {...}}``
            (:class:`trainer.run.hooks.HookSpec`; called in this order on every rank).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    anomaly: AnomalyConfig = field(default_factory=AnomalyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run_dir: str = "runs/train"
    steps: int = setting(100, ge=1)
    log_every: int = setting(10, ge=1)
    seed: int = setting(0, ge=0)
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    precision: str = setting("fp32", choices=("fp32", "bf16"))
    activation_checkpointing: str | bool = "none"
    compile: bool = False
    hooks: list = field(default_factory=list)

    def validate(self) -> None:
        """Check every declared field of every section in one pass (:func:`colaflow.config.check_fields`),
        then the relations between fields; raises ``ValueError`` (a ``ConfigError``) naming the bad
        key and what to use (``ConfigError`` too for a ``hooks`` entry whose class does not import,
        implement the hook protocol or take its args)."""
        check_fields(self)
        self.model.validate()
        checkpoint_mode(self.activation_checkpointing)  # a mode name, or true/false of older configs
        if self.zero.cpu_offload and self.zero.stage != 3:
            raise ValueError(f"zero.cpu_offload=true needs zero.stage=3 (parameters sharded), not {self.zero.stage}")
        if self.model.init_from and self.checkpoint.resume not in ("", "latest"):
            raise ValueError(f"model.init_from={self.model.init_from} starts a new run from weights, "
                             f"checkpoint.resume={self.checkpoint.resume} continues an earlier one: set only one")
        o = self.optim
        if o.min_lr > o.lr:
            raise ConfigError(f"optim.min_lr={o.min_lr} is above optim.lr={o.lr}: the cosine would rise; set "
                              "optim.min_lr <= optim.lr")
        if not (isinstance(o.betas, list) and len(o.betas) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in o.betas)):
            raise ConfigError(f"optim.betas={o.betas!r}: use two numbers in [0, 1), e.g. [0.9, 0.95]")
        if 0 < self.anomaly.spike_ratio <= 1:
            raise ConfigError(f"anomaly.spike_ratio={self.anomaly.spike_ratio}: use 0 (off) or a ratio > 1 (every "
                              "loss at or above its average would count as a spike)")
        self.data.validate()
        parse_hooks(self.hooks)


# AnomalyConfig fields of fault injection that moved out of the trainer into test step hooks, with
# their defaults; every config.json and checkpoint config.yaml written before then holds them
_REMOVED_TEST_HOOKS = {"inject_nan_at_steps": [], "inject_spike_at_steps": [], "inject_spike_factor": 1000.0,
                       "inject_kill_at_step": 0, "inject_rank": -1, "inject_layer": ""}


def read_saved_config(path: str) -> TrainConfig:
    """The config a run saved (``RUN_DIR/config.json`` or a checkpoint's ``config.yaml``; JSON or
    YAML). Keys ``anomaly.inject_*`` of older runs are dropped, with one warning when they were set
    (the faults they injected are not re-applied).

    Raises:
        FileNotFoundError: no such file.
        colaflow.config.ConfigError: a key this trainer does not know, or a value of the wrong type.
    """
    import yaml
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    anomaly = data.get("anomaly") if isinstance(data, dict) else None
    if isinstance(anomaly, dict):
        found = {k: anomaly.pop(k) for k in _REMOVED_TEST_HOOKS if k in anomaly}
        were_set = {k: v for k, v in found.items() if v != _REMOVED_TEST_HOOKS[k]}
        if were_set:
            log.warning("%s: %s: test hooks of an older trainer, ignored (the faults they injected are not "
                        "re-applied; a step hook in hooks: does that now)", path,
                        ", ".join(f"anomaly.{k}={v!r}" for k, v in were_set.items()))
    return from_dict(TrainConfig, data)
