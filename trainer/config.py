"""Trainer configuration: the top-level ``TrainConfig`` read from YAML by ``shards.config.load_config``.

Every section is a dataclass with defaults that run on a laptop CPU; a YAML file fills some fields
and ``key=value`` overrides on the command line fill others (``optim.lr=1e-3 zero.stage=3``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cache.config import CacheConfig
from loaders.config import DataConfig


@dataclass
class ModelConfig:
    """GPT-style decoder sizes.

    Attributes:
        vocab_size: token vocabulary; 0 = take ``vocab_size`` from the data manifest.
        d_model: hidden width (must be divisible by ``n_heads``; head dim must be even for RoPE).
        n_layers: transformer blocks.
        n_heads: attention heads.
        ffn_mult: SwiGLU hidden width as a multiple of ``d_model`` (rounded up to a multiple of 8).
        max_seq_len: longest position the model is used at (documents restart positions at 0).
        norm: ``rmsnorm`` or ``layernorm``.
        tie_embeddings: share the input embedding with the output projection.
        rope_theta: RoPE base frequency (Su et al. 2021, "RoFormer").
        norm_eps: epsilon inside the norms.
    """

    vocab_size: int = 0
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    ffn_mult: float = 2.667
    max_seq_len: int = 256
    norm: str = "rmsnorm"
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


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
    """

    stage: int = 0
    forward_prefetch: int = 0
    backward_prefetch: int = 0
    bucket_cap_mb: int = 25


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

    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    grad_accum_steps: int = 1


@dataclass
class CheckpointConfig:
    """``torch.distributed.checkpoint`` settings.

    Attributes:
        dir: checkpoint root, relative to ``run_dir`` unless absolute.
        every: save every N optimizer steps (0 = only at the end).
        save_at_end: save after the last step.
        resume: checkpoint folder to resume from, ``latest`` (newest under ``dir``) or ``""``.
    """

    dir: str = "checkpoints"
    every: int = 0
    save_at_end: bool = True
    resume: str = ""


@dataclass
class MetricsConfig:
    """Logging settings.

    Attributes:
        jsonl: metrics file name inside ``run_dir`` (one JSON object per logged step).
        progress: show a tqdm progress bar on rank 0.
    """

    jsonl: str = "metrics.jsonl"
    progress: bool = True


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
        activation_checkpointing: recompute each block's activations in backward.
        compile: ``torch.compile`` each block.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    run_dir: str = "runs/train"
    steps: int = 100
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    activation_checkpointing: bool = False
    compile: bool = False

    def validate(self) -> None:
        """Raise ``ValueError`` naming the bad field and its valid values."""
        if self.zero.stage not in (0, 1, 2, 3):
            raise ValueError(f"zero.stage={self.zero.stage!r}: use 0, 1, 2 or 3")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision={self.precision!r}: use fp32 or bf16")
        if self.model.norm not in ("rmsnorm", "layernorm"):
            raise ValueError(f"model.norm={self.model.norm!r}: use rmsnorm or layernorm")
        if self.model.d_model % self.model.n_heads or (self.model.d_model // self.model.n_heads) % 2:
            raise ValueError(f"model.d_model={self.model.d_model} must split into n_heads={self.model.n_heads} "
                             "heads of even size")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: use auto, cpu or cuda")
        if self.steps < 1 or self.log_every < 1 or self.optim.grad_accum_steps < 1:
            raise ValueError("steps, log_every and optim.grad_accum_steps must be >= 1")
