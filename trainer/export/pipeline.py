"""Write each requested export variant of a checkpoint under a hidden temporary name, verify it
against the fp32 PyTorch reference on validation batches, and rename it to its final name when
every limit holds (else to ``NAME.rejected``); ``conversion_report.json``/``.txt`` record it all.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field

import numpy as np
import torch

import trainer.export.models as models
from trainer.export.config import ExportConfig
from trainer.export.provenance import provenance
from trainer.export.verify import (
    Reference,
    ValidationBatch,
    VariantResult,
    compare,
    latency_ms,
    reference,
    validation_batches,
)

log = logging.getLogger(__name__)
REPORT_JSON = "conversion_report.json"
REPORT_TXT = "conversion_report.txt"


@dataclass
class ConversionReport:
    """What an export wrote and how each variant compared (``conversion_report.json``).

    Attributes:
        checkpoint / out_dir / format: the inputs.
        validation: ``manifest``, ``held_out`` (a ``val`` split, not training data), ``batches``,
            ``rows``, ``seq_len``, ``tokens`` (real tokens compared), ``validated_on``
            (``validation_data``, or ``random_tokens`` when the checkpoint's recorded data was
            unreachable and no ``--data`` was given; ``unavailable`` then says why).
        reference: the fp32 PyTorch model's ``perplexity`` and ``latency_ms`` per batch size.
        variants: one :class:`VariantResult` per written variant.
        provenance: the record stored inside each model.
    """

    checkpoint: str
    out_dir: str
    format: str
    validation: dict
    reference: dict
    variants: list = field(default_factory=list)
    provenance: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether every written variant met its tolerances."""
        return all(v.passed for v in self.variants)

    def to_dict(self) -> dict:
        """The report as JSON-ready dict (``conversion_report.json``)."""
        return {"checkpoint": self.checkpoint, "out_dir": self.out_dir, "format": self.format, "passed": self.passed,
                "validation": self.validation, "reference": self.reference,
                "variants": [v.to_dict() for v in self.variants], "provenance": self.provenance}

    def table(self) -> str:
        """A short text table: perplexity, its change, logit difference, argmax agreement, latency."""
        sizes = sorted(self.reference["latency_ms"])
        head = f"{'variant':<22}{'ppl':>10}{'Δppl':>9}{'max|Δ|':>10}{'argmax':>8}" + "".join(
            f"{f'ms b={b}':>11}" for b in sizes) + "  status"
        rows = [head, f"{'pytorch fp32 (ref)':<22}{self.reference['perplexity']:>10.3f}{'':>27}" + "".join(
            f"{self.reference['latency_ms'][b]:>11.2f}" for b in sizes)]
        for v in self.variants:
            nums = (f"{v.perplexity:>10.3f}{100 * v.ppl_delta:>8.3f}%{v.max_abs_diff:>10.2e}{v.argmax_agreement:>8.4f}"
                    if v.perplexity is not None else f"{'-':>10}{'-':>9}{'-':>10}{'-':>8}")
            lat = "".join(f"{v.latency_ms[b]:>11.2f}" if b in v.latency_ms else f"{'-':>11}" for b in sizes)
            status = "ok" if v.passed else "REJECTED: " + "; ".join(v.failures or [v.error or "failed"])
            rows.append(f"{v.name:<22}{nums}{lat}  {status}")
        return "\n".join(rows)


def checkpoint_config(checkpoint: str):
    """The ``TrainConfig`` a checkpoint folder was trained with (its ``config.yaml``).

    Raises:
        FileNotFoundError: no ``config.yaml``: not a colaflow checkpoint folder.
    """
    from trainer.config import read_saved_config
    config_path = os.path.join(checkpoint, "config.yaml")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{checkpoint}: no config.yaml; not a colaflow checkpoint folder (step_XXXXXX)?")
    return read_saved_config(config_path)


def load_model(checkpoint: str):
    """``(fp32 GPT in eval mode, TrainConfig, config dict)`` of a checkpoint folder (one process).

    Raises:
        FileNotFoundError / ValueError: not a readable colaflow checkpoint.
    """
    from colaflow.config import to_dict
    from trainer.checkpointing import load_full_state
    from trainer.model import GPT
    cfg = checkpoint_config(checkpoint)
    model = GPT(cfg.model)
    model.load_state_dict(load_full_state(checkpoint)["model"])
    model.set_attention("dense")  # the CPU path, and the one torch.export (ONNX) traces
    return model.float().eval(), cfg, to_dict(cfg)


def resolve_validation(data: str) -> tuple[str, bool]:
    """``(manifest URL, held_out)``: the ``val`` split of the dataset at ``data`` when it lists one,
    else ``data`` itself (not held out)."""
    from shards.format.manifest import Manifest, split_manifest_url
    manifest = Manifest.load(data)
    if "val" in manifest.splits:
        return split_manifest_url(data, manifest, "val"), True
    log.warning("%s lists no 'val' split: verifying on its own data, which the model may have trained on", data)
    return data, False


def check_vocab(manifest_url: str, vocab_size: int) -> None:
    """Raise ``ValueError`` when the data's vocabulary does not fit a model of ``vocab_size`` tokens
    (validation data of another dataset)."""
    from shards.format.manifest import Manifest
    data_vocab = Manifest.load(manifest_url).vocab_size
    if data_vocab > vocab_size:
        raise ValueError(f"{manifest_url}: vocabulary of {data_vocab} tokens does not fit the model's {vocab_size}; "
                         "pass --data with the dataset the model was trained on")


def synthetic_batches(vocab: int, seq_len: int, rows: int) -> list[ValidationBatch]:
    """Random-token rows (seed 0), for a parity check when no validation data can be reached."""
    from trainer.evaluation.synthetic import synthetic_batch
    b = synthetic_batch([[seq_len // 2, seq_len - seq_len // 2]] * rows, seq_len, vocab=vocab, seed=0)
    return [ValidationBatch(*(t.numpy().astype(np.int64) for t in
                              (b.input_ids, b.position_ids, b.document_ids, b.labels)))]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def commit_variant(tmp: str, final: str, result: VariantResult, *others: VariantResult) -> None:
    """Rename a verified variant (a file, or the ``hf`` folder) to ``final``; a failed one to
    ``final.rejected`` (and drop a stale ``final``). ``others``: further checks of the same file,
    which must pass too and get the same ``path``."""
    results = (result, *others)
    passed = all(r.passed for r in results)
    if passed:
        _remove(final)  # a folder is not replaced by os.replace; a file is, so this changes nothing for one
        os.replace(tmp, final)
        path = final
    else:
        _remove(final)
        path = None
        if os.path.lexists(tmp):
            _remove(final + ".rejected")
            os.replace(tmp, final + ".rejected")
            path = final + ".rejected"
    for r in results:
        r.path = path


def _tmp(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f".{name}.tmp-{os.getpid()}")


def _check(result: VariantResult, tmp: str, runner, ref, batches, cfg: ExportConfig, tol) -> None:
    compare(result, runner, ref, batches, tol)
    result.latency_ms = latency_ms(runner, batches[0], cfg.batch_sizes, cfg.latency_runs)
    result.bytes = os.path.getsize(tmp)


@dataclass
class ExportJob:
    """What every format's writer gets (:data:`WRITERS`).

    Attributes:
        checkpoint / out_dir / cfg: the command's inputs.
        name: the single artifact's name in ``out_dir`` (``.pt`` file, ``hf`` folder).
        model / train_cfg: the fp32 reference ``GPT`` and the checkpoint's ``TrainConfig``.
        ref / batches: the reference's outputs on the validation batches, and those batches.
        record: the provenance stored with every variant.
        data: the dataset (its manifest URL) the model was trained on, ``None`` when unreachable.
    """

    checkpoint: str
    out_dir: str
    cfg: ExportConfig
    name: str
    model: torch.nn.Module
    train_cfg: object
    ref: Reference
    batches: list
    record: dict
    data: str | None


def onnx_variants(job: ExportJob) -> list[VariantResult]:
    """Export, verify and commit ``model.{precision}.onnx`` for each of ``cfg.precisions``."""
    cfg, out_dir, batches = job.cfg, job.out_dir, job.batches
    source = _tmp(out_dir, "source.fp32.onnx")
    results = []
    try:
        try:
            models.export_onnx(job.model, source, batches[0].inputs(), cfg.opset)
            export_error = None
        except Exception as e:  # any exporter failure fails every variant, with its message
            export_error = f"ONNX export failed: {type(e).__name__}: {e}"
        for precision in cfg.precisions:
            name = f"model.{precision}.onnx"
            result, tmp = VariantResult(name, "onnx", precision, error=export_error), _tmp(out_dir, name)
            if export_error is None:
                try:
                    {"fp32": shutil.copyfile, "fp16": models.convert_fp16, "int8": models.quantize_int8}[precision](
                        source, tmp)
                    models.set_provenance(tmp, {**job.record, "format": "onnx", "precision": precision})
                    _check(result, tmp, models.ort_runner(tmp, cfg.threads), job.ref, batches, cfg,
                           getattr(cfg.tolerance, precision))
                except Exception as e:  # a conversion or runtime failure rejects this variant only
                    result.passed, result.error = False, f"{type(e).__name__}: {e}"
            commit_variant(tmp, os.path.join(out_dir, name), result)
            results.append(result)
    finally:
        if os.path.exists(source):
            os.remove(source)
    return results


def pt_variant(job: ExportJob) -> list[VariantResult]:
    """Write, verify and commit the consolidated ``torch.save`` file (``torch.load(f)["model"]`` =
    weights, ``["provenance"]`` = ``record``)."""
    from trainer.checkpointing import export_checkpoint
    from trainer.model import GPT
    result, tmp = VariantResult(job.name, "pt", "fp32"), _tmp(job.out_dir, job.name)
    try:
        export_checkpoint(job.checkpoint, tmp)
        state = torch.load(tmp, weights_only=False)
        state["provenance"] = {**job.record, "format": "pt", "precision": "fp32"}
        torch.save(state, tmp)
        reloaded = GPT(job.train_cfg.model)
        reloaded.load_state_dict(torch.load(tmp, weights_only=False)["model"])
        _check(result, tmp, models.torch_runner(reloaded.float()), job.ref, job.batches, job.cfg, job.cfg.tolerance.pt)
    except Exception as e:  # a failed write or reload rejects the file
        result.passed, result.error = False, f"{type(e).__name__}: {e}"
    commit_variant(tmp, os.path.join(job.out_dir, job.name), result)
    return [result]


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, n)) for root, _, names in os.walk(folder) for n in names)


def _prompt(batches: list[ValidationBatch], length: int = 8) -> list[int]:
    """The first ``length`` tokens (fewer if it is shorter) of the first validation row's first document."""
    b = batches[0]
    doc = b.document_ids[0]
    return b.input_ids[0][: max(1, min(length, int((doc == doc[0]).sum())))].tolist()


def hf_variants(job: ExportJob) -> list[VariantResult]:
    """Write the Hugging Face Llama folder (:mod:`trainer.export.hf`), load it back with
    ``transformers`` and check it: fp32 logits against the reference (``tolerance.hf``), the same in
    bf16 (``tolerance.hf_bf16``: reported, not enforced by default), a greedy generation of
    ``generate_tokens`` tokens equal to colaflow's own (:func:`trainer.model.greedy_decode`), and the
    tokenizer loading with ``AutoTokenizer``. The folder is committed when all hold."""
    from trainer.export import hf
    from trainer.model import greedy_decode
    cfg, final = job.cfg, os.path.join(job.out_dir, job.name)
    tmp = _tmp(job.out_dir, job.name)
    fp32, bf16 = VariantResult(job.name, "hf", "fp32"), VariantResult(f"{job.name} (bf16 load)", "hf", "bf16")
    tokenizer = hf.tokenizer_files(job.data)
    if tokenizer.note:
        fp32.notes.append(tokenizer.note)
    try:
        _remove(tmp)
        hf.write_folder(job.model, tmp, tokenizer, {**job.record, "format": "hf", "precision": "fp32"},
                        cfg.max_shard_size)
        fp32.bytes = bf16.bytes = _folder_bytes(tmp)
        loaded = hf.load_folder(tmp, torch.float32)
        compare(fp32, hf.document_runner(loaded), job.ref, job.batches, cfg.tolerance.hf)
        fp32.latency_ms = latency_ms(hf.row_runner(loaded), job.batches[0], cfg.batch_sizes, cfg.latency_runs)
        prompt = _prompt(job.batches)
        want = greedy_decode(job.model, prompt, cfg.generate_tokens, tokenizer.ids.eos_id)
        got = hf.greedy_hf(loaded, prompt, cfg.generate_tokens)
        generation = {"prompt": prompt, "colaflow": want, "transformers": got, "match": got == want}
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            fp32.failures.append(f"greedy generation differs from colaflow's at new token {first}")
            fp32.passed = False
        if tokenizer.files:
            from transformers import AutoTokenizer
            try:
                text = AutoTokenizer.from_pretrained(tmp, local_files_only=True).decode(prompt + got)
                generation["text"] = text
            except Exception as e:  # noqa: BLE001 - any failure to load means the folder is not usable as shipped
                fp32.failures.append(f"AutoTokenizer does not load the folder ({type(e).__name__}: {e})")
                fp32.passed = False
        fp32.details["generation"] = generation
        fp32.details["files"] = sorted(os.listdir(tmp))
        del loaded
        compare(bf16, hf.document_runner(hf.load_folder(tmp, torch.bfloat16)), job.ref, job.batches,
                cfg.tolerance.hf_bf16)
    except Exception as e:  # a failed write or reload rejects the folder
        fp32.passed, fp32.error = False, f"{type(e).__name__}: {e}"
    commit_variant(tmp, final, fp32, bf16)
    return [fp32, bf16]


# the one place a format is chosen: --format NAME -> the writer of its variants
WRITERS = {"onnx": onnx_variants, "pt": pt_variant, "hf": hf_variants}


def run_export(checkpoint: str, out_dir: str, cfg: ExportConfig, name: str = "",
               report_prefix: str = "") -> ConversionReport:
    """Export ``checkpoint`` into ``out_dir`` as ``cfg`` says; returns the report (also written as
    ``{report_prefix}conversion_report.json``/``.txt``: a prefix such as ``model.pt.`` keeps the
    report of a single artifact exported into a shared folder beside it, named after it).
    ``name``: the single artifact of ``pt`` and ``hf`` (default ``model.pt``, ``hf``).
    ``report.passed`` is false when any variant was rejected.

    Raises:
        ValueError: invalid ``cfg``, or a model the format cannot express
            (:class:`trainer.llama.NotExpressible`); FileNotFoundError: no checkpoint, or ``cfg.data``
            is missing.
    """
    cfg.validate()
    if cfg.threads:  # the PyTorch reference runs with as many threads as onnxruntime, for fair latency
        torch.set_num_threads(cfg.threads)
    if cfg.format == "hf":  # refused before any weight is read
        from trainer.llama import check_expressible
        check_expressible(checkpoint_config(checkpoint).model)
    model, train_cfg, config = load_model(checkpoint)
    seq_len = cfg.seq_len or min(train_cfg.data.seq_len, train_cfg.model.max_seq_len)
    data = cfg.data or train_cfg.data.manifest
    unavailable = None
    try:
        val_url, held_out = resolve_validation(data)
        check_vocab(val_url, train_cfg.model.vocab_size)
        batches = validation_batches(val_url, seq_len, cfg.rows, cfg.batches)
    except (FileNotFoundError, OSError, ValueError) as e:
        if cfg.data:
            raise
        unavailable = f"no validation data at {data} ({type(e).__name__}: {e})"
        val_url, held_out, data = None, False, None
        batches = synthetic_batches(train_cfg.model.vocab_size, seq_len, cfg.rows)
    ref_runner = models.torch_runner(model)
    ref = reference(ref_runner, batches)
    record = provenance(checkpoint, config, data, val_url)
    os.makedirs(out_dir, exist_ok=True)
    job = ExportJob(checkpoint, out_dir, cfg, name or {"pt": "model.pt", "hf": "hf"}.get(cfg.format, ""), model,
                    train_cfg, ref, batches, record, data)
    variants = WRITERS[cfg.format](job)
    report = ConversionReport(
        checkpoint, out_dir, cfg.format,
        {"manifest": val_url, "held_out": held_out, "batches": len(batches), "rows": cfg.rows, "seq_len": seq_len,
         "tokens": ref.tokens, "validated_on": "random_tokens" if unavailable else "validation_data",
         "unavailable": unavailable},
        {"perplexity": ref.perplexity, "latency_ms": latency_ms(ref_runner, batches[0], cfg.batch_sizes,
                                                                cfg.latency_runs)},
        variants, record)
    for report_name, text in ((report_prefix + REPORT_JSON, json.dumps(report.to_dict(), indent=2, default=str) + "\n"),
                              (report_prefix + REPORT_TXT, report.table() + "\n")):
        tmp = _tmp(out_dir, report_name)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, report_name))
    return report
