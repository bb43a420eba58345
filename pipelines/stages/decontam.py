"""Benchmark decontamination: documents sharing an n-gram (13 words by default, as GPT-3: Brown et
al. 2020, appendix C) with an evaluation set the user gives are dropped, or the matching spans cut.

Words are the lower-cased ``\\w+`` runs (punctuation and whitespace ignored, as GPT-3). Each
evaluation set becomes a sorted array of 64-bit n-gram hashes built from its own texts only (every
string field of a JSONL record or Parquet row, every paragraph of a text file), so memory is 8
bytes per n-gram of evaluation data whatever the corpus size; a document's n-grams are looked up
by binary search. Drops count as ``filtered:decontam_<set>`` (the first set, in config order, it
matches), cut documents as ``decontaminated:<set>``; every matched document is listed in
``OUT/decontaminated/`` (:func:`listing`).
"""
from __future__ import annotations

import hashlib
import json
import re

import fsspec
import numpy as np

from colaflow.config import ConfigError
from pipelines.config import DecontamConfig, InputConfig
from pipelines.records import PARQUET, Doc, file_format
from pipelines.stages.step import DocumentStep, StepResult

_WORD = re.compile(r"\w+")
_PUNCT = re.compile(r"[^\w\s]*")
_ROLL = np.uint64(0x100000001B3)  # FNV-1 64-bit prime: the n-gram hash rolls word hashes with it
_MIX = np.uint64(0xFF51AFD7ED558CCD)  # MurmurHash3 fmix64 constant


class EvalSetError(ConfigError):
    """An evaluation set names no readable file or holds no n-gram (a config error: exit 2); the
    message says what to do."""


def ngram_hashes(words: list[str], n: int) -> np.ndarray:
    """``uint64[len(words) - n + 1]``: a 64-bit hash of each run of ``n`` words (none when fewer)."""
    if len(words) < n:
        return np.zeros(0, dtype=np.uint64)
    w = np.array([int.from_bytes(hashlib.blake2b(x.encode("utf-8"), digest_size=8).digest(), "little")
                  for x in words], dtype=np.uint64)
    k = len(w) - n + 1
    h = np.zeros(k, dtype=np.uint64)
    for j in range(n):
        h = h * _ROLL + w[j:j + k]  # wraps mod 2^64
    h ^= h >> np.uint64(33)
    h *= _MIX
    return h ^ (h >> np.uint64(33))


def _strings(value) -> list[str]:
    """Every string inside a JSON value (lists and objects walked)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for item in value for s in _strings(item)] if isinstance(value, list) else []


def eval_texts(path: str):
    """The texts of one evaluation file: each string field of a JSONL record or Parquet row, each
    paragraph (blank-line separated) of a text file.

    Raises:
        EvalSetError: the file has no known format (``.jsonl``, ``.parquet``, ``.txt``, compressed or
            not), or a JSONL line is not JSON.
    """
    fmt = file_format(path, InputConfig())
    if fmt is None:
        raise EvalSetError(f"decontam evaluation file {path}: unknown format; give .jsonl, .parquet or .txt "
                           "files (optionally .gz/.bz2/.zst)")
    if fmt == PARQUET:
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as f:
            for row in pq.read_table(f).to_pylist():
                yield from _strings(row)
        return
    with fsspec.open(path, "rt", encoding="utf-8", compression="infer") as f:
        if fmt == "text":
            yield from re.split(r"\n\s*\n", f.read())
            return
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise EvalSetError(f"decontam evaluation file {path}, line {number}: not JSON ({e}); fix the line "
                                       "or give the file as .txt") from None
                yield from _strings(record)


def eval_ngrams(pattern: str, n: int) -> np.ndarray:
    """The sorted, distinct n-gram hashes of the evaluation files ``pattern`` matches (path or glob).

    Raises:
        EvalSetError: nothing matches, a file has no known format, or no text holds ``n`` words.
    """
    files = sorted(of.path if "://" not in pattern else of.full_name for of in fsspec.open_files(pattern))
    if not files:
        raise EvalSetError(f"decontam evaluation set {pattern!r}: no file matches; give a path or quoted glob of "
                           ".jsonl, .parquet or .txt files")
    parts = [ngram_hashes(_WORD.findall(text.lower()), n) for path in files for text in eval_texts(path)]
    hashes = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)
    if not len(hashes):
        raise EvalSetError(f"decontam evaluation set {pattern!r}: no text has {n} words; lower decontam.ngram "
                           "or check the files")
    return hashes


def load_eval_sets(cfg: DecontamConfig) -> dict[str, np.ndarray]:
    """``{set name: sorted n-gram hashes}`` of ``cfg.eval_sets``, in config order (the driver calls
    it before a run to refuse a bad set in one line; each worker once in :meth:`DecontamStep.setup`)."""
    return {name: eval_ngrams(pattern, cfg.ngram) for name, pattern in cfg.eval_sets.items()}


def _found(hashes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``bool[len(hashes)]``: which of ``hashes`` are in the sorted ``table``."""
    at = np.minimum(np.searchsorted(table, hashes), len(table) - 1)
    return table[at] == hashes


def listing(doc: Doc, matches: dict[str, int], action: str) -> str:
    """One JSON line of ``OUT/decontaminated/``: the document's id and source, ``action``
    (``dropped`` or ``cut``) and ``eval_sets`` (``{set: matching n-grams}``)."""
    return json.dumps({"id": doc.id, "source": doc.source, "action": action, "eval_sets": matches},
                      sort_keys=True, ensure_ascii=False)


def cut_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the character ``spans`` (sorted, not overlapping); the pieces left are
    joined by one newline each, their surrounding whitespace trimmed, blank ones left out."""
    pieces, at = [], 0
    for start, end in spans:
        pieces.append(text[at:start].strip())
        at = end
    pieces.append(text[at:].strip())
    return "\n".join(p for p in pieces if p)


class DecontamStep(DocumentStep):
    """Drops (``action: drop``) a document sharing an n-gram with an evaluation set as
    ``decontam_<set>``, or (``action: cut``) cuts the words of every matching n-gram (and the
    punctuation right after them) and keeps the rest with a ``decontaminated:<set>`` event per set
    matched (dropped as ``decontam_<set>`` when nothing is left). Lists every matched document
    (:func:`listing`). Keeps every document when ``cfg.eval_sets`` is empty. The sets load in
    :meth:`setup`."""

    def __init__(self, cfg: DecontamConfig):
        self.cfg = cfg
        self._sets: dict[str, np.ndarray] | None = None

    def setup(self) -> None:
        """Build the evaluation sets' n-gram hashes (:func:`load_eval_sets`)."""
        self._sets = load_eval_sets(self.cfg)

    def apply(self, doc: Doc) -> StepResult:
        """Keep an unmatched document unchanged; drop or cut a matched one, listing it.

        Raises:
            RuntimeError: :meth:`setup` has not run.
        """
        if self._sets is None:
            raise RuntimeError("DecontamStep.apply before setup(): the evaluation sets are not loaded")
        if not self._sets:
            return StepResult.keep(doc)
        words = list(_WORD.finditer(doc.text))
        hashes = ngram_hashes([m.group().lower() for m in words], self.cfg.ngram)
        hits = {name: _found(hashes, table) for name, table in self._sets.items()}
        matches = {name: int(hit.sum()) for name, hit in hits.items() if hit.any()}
        if not matches:
            return StepResult.keep(doc)
        first = next(iter(matches))
        if self.cfg.action == "drop":
            return StepResult.reject(f"decontam_{first}", listing=listing(doc, matches, "dropped"))
        covered = np.zeros(len(words) + 1, dtype=np.int64)  # +1 at each match's first word, -1 past its last
        for hit in hits.values():
            starts = np.flatnonzero(hit)
            np.add.at(covered, starts, 1)
            np.add.at(covered, starts + self.cfg.ngram, -1)
        inside = np.flatnonzero(np.cumsum(covered[:-1]) > 0)
        runs = np.split(inside, np.flatnonzero(np.diff(inside) > 1) + 1)  # consecutive covered words
        text = cut_spans(doc.text, [(words[r[0]].start(), _PUNCT.match(doc.text, words[r[-1]].end()).end())
                                    for r in runs])  # a span ends past the punctuation after its last word
        if not text:
            return StepResult.reject(f"decontam_{first}", listing=listing(doc, matches, "dropped"))
        return StepResult.keep(doc._replace(text=text), {f"decontaminated:{name}": 1 for name in matches},
                               listing=listing(doc, matches, "cut"))
