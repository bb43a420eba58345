"""ZeRO stages 0-3 with real torch.distributed gloo processes: memory per rank, training agreement
(also of the memory options: selective checkpointing, activation and ZeRO-3 CPU offload), gradient
accumulation normalised by the global token count, DCP checkpoint round trip."""
import json
import os
import subprocess
import sys
import tempfile

import torch

from trainer import checkpointing as ckpt
from trainer.distributed import parallel
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from tests.support.launch import run_local_workers
from trainer.model import GPT, count_parameters
from trainer.evaluation.synthetic import synthetic_batch as make_batch
from trainer.train import build_model, forward_backward, train_step

# many similar-sized tensors so ZeroRedundancyOptimizer's whole-tensor partition balances
MEM_MODEL = ModelConfig(vocab_size=256, d_model=64, n_layers=8, n_heads=4, ffn_mult=2.0)
SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4)


# memory options (trainer/memory.py) that must train as plain DDP does:
# name -> (zero.stage, zero.cpu_offload, activation_checkpointing, memory.offload_activations)
MEMORY_MODES = {"selective + offload blocks": (0, False, "selective", "blocks"),
                "full + offload model": (0, False, "full", "model"), "zero3 cpu offload": (3, True, "none", "none")}


def _cfg(stage: int, model: ModelConfig = SMALL) -> TrainConfig:
    # stage 3 also recomputes activations, so its agreement with DDP covers checkpointing under FSDP
    return TrainConfig(model=model, zero=ZeroConfig(stage=stage, forward_prefetch=1, backward_prefetch=1),
                       optim=OptimConfig(lr=1e-2, grad_clip=1.0), activation_checkpointing=stage == 3)


def _build(cfg: TrainConfig, info, seed: int = 0):
    cfg.seed = seed
    return build_model(cfg, info)


def _full_grads(model) -> dict:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters()}


def _memory_worker():
    info = parallel.init_distributed("cpu")
    out = {}
    for stage in (0, 1, 2, 3):
        cfg = _cfg(stage, MEM_MODEL)
        model, wrapped, opt = _build(cfg, info)
        b = make_batch([[20, 12]], 32, vocab=256, seed=info.rank)
        loss_fn = lambda m: m(b.input_ids, b.position_ids, b.document_ids, b.labels)  # noqa: E731
        out[stage] = parallel.measure_model_states(wrapped, opt, loss_fn, stage)
        out["psi"] = count_parameters(model) if stage == 0 else out["psi"]
    return out


def test_model_state_bytes_match_zero_formulas():
    """Per-rank bytes of params, grads and Adam state follow ZeRO's (fp32) formulas within 10%."""
    for world in (2, 4):
        results = run_local_workers(_memory_worker, world)
        for rank, res in enumerate(results):
            for stage in (0, 1, 2, 3):
                expected = parallel.zero_formula_bytes(stage, res["psi"], world)
                for kind, value in expected.items():
                    got = res[stage][kind]
                    assert abs(got - value) <= 0.1 * value, (world, rank, stage, kind, got, value)


def _mean_loss_and_norm(wrapped, opt, batches, info, cfg) -> list[float]:
    loss_sum, tokens, grad_norm = train_step(wrapped, opt, batches, info, cfg)
    totals = torch.stack([loss_sum, tokens.float()])
    torch.distributed.all_reduce(totals)
    return [(totals[0] / totals[1]).item(), grad_norm.item()]


def _stages_worker(tmp: str):
    info = parallel.init_distributed("cpu")
    rank = info.rank
    out = {"losses": {}, "resume": {}, "accum": {}, "memory": {}}
    batches = [make_batch([[20, 9], [32]], 32, vocab=128, seed=10 * rank + i) for i in range(2)]
    for stage in (0, 1, 2, 3):
        cfg = _cfg(stage)
        model, wrapped, opt = _build(cfg, info)
        steps = [_mean_loss_and_norm(wrapped, opt, batches, info, cfg) for _ in range(3)]
        out["losses"][stage] = [loss for loss, _ in steps]
        if stage == 0:
            out["plain"] = steps
        path = ckpt.save_checkpoint(os.path.join(tmp, f"stage{stage}"), wrapped, opt, 3, {"epoch": 1, "rank": 0})
        _, wrapped2, opt2 = _build(cfg, info, seed=123)
        step, loader_state = ckpt.load_checkpoint(path, wrapped2, opt2)
        after = [train_step(w, o, batches, info, cfg)[0].item() for w, o in ((wrapped, opt), (wrapped2, opt2))]
        out["resume"][stage] = (step, loader_state, after)
        # accumulation: 11 tokens on rank 0 and 101 on rank 1 vs. one process holding both
        model, wrapped, opt = _build(cfg, info)
        mine = make_batch([[12]] if rank == 0 else [[102]], 128, vocab=128, seed=rank)
        forward_backward(wrapped, [mine], info, cfg)
        out["accum"][stage] = _full_grads(model)
    for name, (stage, cpu_offload, checkpointing, offload) in MEMORY_MODES.items():
        cfg = _cfg(stage)
        cfg.zero.cpu_offload, cfg.activation_checkpointing = cpu_offload, checkpointing
        cfg.memory.offload_activations = offload
        cfg.validate()
        _, wrapped, opt = _build(cfg, info)
        out["memory"][name] = [_mean_loss_and_norm(wrapped, opt, batches, info, cfg) for _ in range(2)]
    for stage in (1, 3):  # bf16 through autocast (stage 1) and through FSDP's MixedPrecisionPolicy (stage 3)
        cfg = _cfg(stage)
        cfg.precision = "bf16"
        _, wrapped, opt = _build(cfg, info)
        out["bf16", stage] = [train_step(wrapped, opt, batches, info, cfg)[0].item() for _ in range(3)]
    return out


ACCUM = 3


def _accum_memory_worker():
    """Gradient bytes this rank holds after each of ACCUM micro-batches of one real
    :func:`trainer.train.forward_backward` (read at the next micro-batch's forward, and at the end)."""
    info = parallel.init_distributed("cpu")
    out = {}
    for stage in (0, 1, 2, 3):
        cfg = _cfg(stage, MEM_MODEL)
        cfg.activation_checkpointing = False
        model, wrapped, _ = _build(cfg, info)
        seen = []
        hook = wrapped.register_forward_pre_hook(lambda m, args: seen.append(parallel.grad_bytes(m)))
        batches = [make_batch([[20, 12]], 32, vocab=256, seed=10 * info.rank + i) for i in range(ACCUM)]
        forward_backward(wrapped, batches, info, cfg)
        hook.remove()
        out[stage] = seen[1:] + [parallel.grad_bytes(wrapped)]
        out["psi"] = count_parameters(model)
    return out


def test_gradients_stay_sharded_across_accumulation_steps():
    """ZeRO-2/3 keep 4Ψ/N gradient bytes per rank after every micro-batch of an accumulated step,
    not only after the last (FSDP2 without gradient sync would hold the unsharded 4Ψ in between);
    stages 0/1 hold the full 4Ψ, as their formula says."""
    world = 2
    for res in run_local_workers(_accum_memory_worker, world):
        for stage in (0, 1, 2, 3):
            expected = parallel.zero_formula_bytes(stage, res["psi"], world)["grads"]
            assert len(res[stage]) == ACCUM
            for i, got in enumerate(res[stage]):
                assert abs(got - expected) <= 0.05 * expected, (stage, i, got, expected)


def test_zero_stages_and_memory_options_train_agree_resume_and_normalise_by_global_tokens():
    """Stages 1-3 and every memory option give plain DDP's per-step losses (and the memory options
    its gradient norms; their second step's loss compares their first update too)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = run_local_workers(_stages_worker, 2, tmp)
    ref = results[0]["losses"][0]
    assert ref[-1] < ref[0]  # a few steps on the same data reduce the loss
    for res in results:
        for stage in (0, 1, 2, 3):
            torch.testing.assert_close(res["losses"][stage], ref, rtol=1e-4, atol=1e-4)
            step, loader_state, (orig, restored) = res["resume"][stage]
            assert step == 3 and loader_state["epoch"] == 1 and loader_state["rank"] == 0
            assert abs(orig - restored) < 1e-4 * abs(orig)
        for name in MEMORY_MODES:
            torch.testing.assert_close(res["memory"][name], res["plain"][:2], rtol=1e-5, atol=1e-6, msg=name)
        for stage in (1, 3):
            losses = torch.tensor(res["bf16", stage]) / 116  # this rank's real tokens per step
            assert losses[-1] < losses[0] and abs(losses[0] - res["losses"][0][0]) < 0.05 * res["losses"][0][0]
    # single-process reference: both documents in one batch, mean over all 11 + 101 real tokens
    torch.manual_seed(0)
    model = GPT(SMALL)
    docs = [make_batch([[12]], 128, vocab=128, seed=0), make_batch([[102]], 128, vocab=128, seed=1)]
    both = torch.cat([d.input_ids for d in docs]), torch.cat([d.position_ids for d in docs])
    loss = model(both[0], both[1], torch.cat([d.document_ids for d in docs]), torch.cat([d.labels for d in docs]))
    (loss / 112).backward()
    for stage in (0, 1, 2, 3):
        for name, p in model.named_parameters():
            for res in results:
                torch.testing.assert_close(res["accum"][stage][name], p.grad, rtol=1e-4, atol=1e-6)


def test_accumulation_over_micro_batches_equals_one_batch():
    """Two micro-batches of 11 and 101 real tokens give the gradients of one batch holding both."""
    info = parallel.init_distributed("cpu")
    cfg = _cfg(0)
    a, b = make_batch([[12]], 128, vocab=128, seed=0), make_batch([[102]], 128, vocab=128, seed=1)
    both = make_batch([[12], [102]], 128, vocab=128, seed=0)
    both.input_ids[1], both.labels[1] = b.input_ids[0], b.labels[0]
    grads = []
    for batches in ([a, b], [both]):
        model, wrapped, _ = _build(cfg, info)
        forward_backward(wrapped, batches, info, cfg)
        grads.append(_full_grads(model))
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7)
    torch.distributed.destroy_process_group()


def test_a_world_of_one_leaves_the_environment_alone():
    """Without torchrun, init_distributed once wrote RANK/MASTER_PORT... into os.environ: a child
    process started afterwards (``python -m trainer``) took itself for a torchrun rank of that world
    and failed with EADDRINUSE on its port."""
    code = ("import os, json\n"
            "from trainer.distributed.parallel import init_distributed\n"
            "info = init_distributed('cpu')\n"
            "import torch.distributed as dist\n"
            "t = __import__('torch').ones(3)\n"
            "dist.all_reduce(t)\n"
            "print(json.dumps({'env': sorted(k for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')"
            " if k in os.environ), 'world': info.world_size, 'rank': info.rank, 'sum': t.tolist()}))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"env": [], "world": 1, "rank": 0, "sum": [1.0, 1.0, 1.0]}
