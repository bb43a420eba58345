"""Tokenizer stage: the tokenizer (given, of any kind in :mod:`shards.tokenizers`, or trained on a
deterministic sample: sentencepiece, or a byte-level BPE with ``tokenizer.kind=hf``), and tokenisation
with each document's BOS/EOS.

The sample is chosen by content hash, not by arrival order, so every runner and worker
count picks the same documents: a document joins when its hash falls under
``sample_fraction`` of the hash space, and the sample is filled in hash order up to
``sample_max_bytes``. When no document falls under the fraction (a tiny corpus), the sample is
filled from all documents in hash order instead, so it is never empty while documents exist.
The sample is taken in two steps (:mod:`pipelines.stages.tokenizer_sample`). Lines longer than
``max_sentence_bytes`` are cut at spaces for training. Training runs single-threaded because
sentencepiece's multi-threaded trainer gives different models for different thread counts.
"""
from __future__ import annotations

import io
import re
import sys

import apache_beam as beam
import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from colaflow.config import ConfigError
from colaflow.wording import count
from pipelines.accounting.read_summary import ReadSummary
from pipelines.accounting.stats import EventTally
from pipelines.config import TokenizerConfig
from pipelines.records import Doc, TokenizedDoc
from pipelines.stages.tokenizer_sample import SampleCutoff, SmallestHashSample
from shards.format.manifest import TokenizerIdentity
from shards.format.tokens import check_token_ids
from shards.tokenizers import Tokenizer, TokenizerError, TokenizerFile, build, read
from shards.tokenizers import hf as hf_kind
from shards.tokenizers import spm as spm_kind

# Intermediate merges of the sample's cutoff: the final merge holds SAMPLE_FANOUT partial cutoffs
# (each at most the rows of sample_max_bytes of documents), not one per bundle
SAMPLE_FANOUT = 8
# Documents encoded per batch call: its token lists of Python ints take about 20 times the bytes of
# the arrays kept, so a whole batch of them was a Dask worker's largest task
ENCODE_DOCS = 64


def training_lines(texts: list[str], max_bytes: int) -> list[str]:
    """Non-blank lines of ``texts``, each line longer than ``max_bytes`` UTF-8 bytes cut into pieces
    of at most ``max_bytes``: at the last space inside the limit, else at a character boundary.
    sentencepiece skips any sentence over its ``max_sentence_length`` whole, so an uncut long
    one-line document would never reach training."""
    out = []
    for text in texts:
        for line in text.split("\n"):
            data = line.strip().encode("utf-8")
            while len(data) > max_bytes:
                cut = data.rfind(b" ", 0, max_bytes + 1)
                if cut <= 0:
                    cut = max_bytes
                    while data[cut] & 0xC0 == 0x80:  # inside a multi-byte character: back to its start
                        cut -= 1
                out.append(data[:cut].decode("utf-8"))
                data = data[cut:].lstrip()
            if data:
                out.append(data.decode("utf-8"))
    return out


class EmptySampleError(ValueError):
    """No document reached the tokenizer (every record was a dead letter or filtered, or the input
    files hold no record); the message says what to check. A data error: the command line prints
    it in one line, without the traceback Beam logs for a failed step (exit 1)."""


class NoRecordsError(EmptySampleError):
    """The input files hold no record at all (no Parquet rows, only blank lines or whitespace, or
    they decompress to nothing): :func:`pipelines.job.run` turns it into an ``InputError`` naming
    the files (exit 2)."""


def empty_error(summary: ReadSummary | None, what: str, instead: str) -> EmptySampleError:
    """The error for a run that kept no document: ``what`` happened, then why (``summary``'s
    dead-letter and filter reasons, :meth:`ReadSummary.why_empty`), then what to check
    (:meth:`ReadSummary.what_to_check`), ending with ``instead``. A :class:`NoRecordsError` when ``summary`` counts no record read at all."""
    if summary is not None and summary.records == 0:
        return NoRecordsError("no record was read from the input files; check --input and input.format")
    if summary is None:
        return EmptySampleError(f"{what}; every record was dead-lettered or filtered; check --input, input.format, "
                                f"input.text_field and the filtering steps' settings, {instead}")
    return EmptySampleError(f"{what}; {summary.why_empty()}; {summary.what_to_check()}, {instead}")


def train_sentencepiece(texts: list[str], cfg: TokenizerConfig, summary: ReadSummary | None = None) -> bytes:
    """Train a sentencepiece model on ``texts`` (each line is one training sentence, long lines cut by
    :func:`training_lines`); returns model bytes. ``summary`` (what became of the records read,
    :func:`pipelines.accounting.read_summary.summarize`) is read only to explain an empty sample.

    Raises:
        NoRecordsError: (an ``EmptySampleError``) the sample is empty because ``summary`` counts
            no record read at all.
        EmptySampleError: (a ``ValueError``) the sample is empty (no document reached the
            tokenizer: every record was a dead letter or filtered; the message says which reasons
            and names unreadable files when ``summary`` is given).
        colaflow.config.ConfigError: ``vocab_size`` is below the characters the sample requires at
            ``character_coverage`` (a config problem: the message says which size would do).
        RuntimeError: sentencepiece rejects the sample otherwise (message includes its error).
    """
    lines = training_lines(texts, cfg.max_sentence_bytes)
    if not lines:
        raise empty_error(summary, "tokenizer sample is empty: no document reached the tokenizer",
                          "or pass --tokenizer PATH")
    print(f"training sentencepiece ({cfg.model_type}, vocab {cfg.vocab_size}) on {count(len(texts), 'document')}, "
          f"{sum(len(t.encode('utf-8')) for t in texts) / 1e6:.1f} MB", file=sys.stderr, flush=True)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=cfg.vocab_size,
            model_type=cfg.model_type, character_coverage=cfg.character_coverage,
            byte_fallback=cfg.byte_fallback, hard_vocab_limit=False, num_threads=1,
            input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2,
            max_sentence_length=cfg.max_sentence_bytes,
            normalization_rule_name=cfg.normalization_rule, remove_extra_whitespaces=cfg.remove_extra_whitespaces)
    except RuntimeError as e:
        need = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if need:
            raise ConfigError(f"tokenizer.vocab_size={cfg.vocab_size} is too small: the sample needs "
                              f"tokenizer.vocab_size > {need.group(2)} at character_coverage={cfg.character_coverage}"
                              ": raise tokenizer.vocab_size or lower tokenizer.character_coverage") from None
        raise RuntimeError(f"sentencepiece training on {count(len(lines), 'line')} failed: {e}") from e
    return model.getvalue()


# The byte-level BPE's special tokens, first in its vocabulary (ids 0, 1, 2), by the names
# shards.tokenizers.hf knows them by
BPE_SPECIALS = {"eos_token": "<|endoftext|>", "bos_token": "<|startoftext|>", "pad_token": "<|pad|>"}


def train_byte_level_bpe(texts: list[str], cfg: TokenizerConfig, summary: ReadSummary | None = None) -> bytes:
    """Train a byte-level BPE (GPT-2's byte-to-unicode alphabet, Radford et al. 2019) on ``texts`` with
    the ``tokenizers`` trainer; returns ``tokenizer.json`` bytes. Deterministic: the same sample gives the
    same file at any thread count. Every byte is in the alphabet, so no text is unknown; the
    sentencepiece settings (``model_type``, ``character_coverage``, ``normalization_rule``...) do not apply.

    Raises:
        NoRecordsError / EmptySampleError: the sample is empty (as :func:`train_sentencepiece`).
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not any(t.strip() for t in texts):
        raise empty_error(summary, "tokenizer sample is empty: no document reached the tokenizer",
                          "or pass --tokenizer PATH")
    print(f"training a byte-level BPE (vocab {cfg.vocab_size}) on {count(len(texts), 'document')}, "
          f"{sum(len(t.encode('utf-8')) for t in texts) / 1e6:.1f} MB", file=sys.stderr, flush=True)
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=list(BPE_SPECIALS.values()), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok.to_str().encode("utf-8")


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocab ≤ 65536), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def identity(tok: Tokenizer, cfg: TokenizerConfig) -> TokenizerIdentity:
    """What the manifest records of ``tok`` as ``cfg`` uses it: kind, fingerprint, special ids and
    whether each document starts with BOS (``cfg.add_bos``; ``None``: the tokenizer's convention) and
    ends with EOS (``cfg.add_eos``).

    Raises:
        shards.tokenizers.TokenizerError: BOS or EOS is asked for and the tokenizer has none (the
            message names the setting to turn off).
    """
    add_bos = tok.adds_bos if cfg.add_bos is None else cfg.add_bos
    for key, asked, token_id in (("add_eos", cfg.add_eos, tok.special.eos), ("add_bos", add_bos, tok.special.bos)):
        if asked and token_id is None:
            hint = tok.special_hint(f"{key[4:]}_token") if hasattr(tok, "special_hint") else ""
            raise TokenizerError(f"this {tok.kind} tokenizer has no {key[4:].upper()} token, so tokenizer.{key} "
                                 f"cannot mark documents: give a tokenizer that has one"
                                 f"{f' ({hint})' if hint else ''}, or set tokenizer.{key}=false")
    return TokenizerIdentity(kind=tok.kind, sha256=tok.file.sha256, bos_id=tok.special.bos, eos_id=tok.special.eos,
                             pad_id=tok.special.pad, add_bos=bool(add_bos), add_eos=cfg.add_eos)


def given_tokenizer(cfg: TokenizerConfig) -> TokenizerFile:
    """The tokenizer at ``cfg.path`` (of ``cfg.kind``), checked to have the BOS/EOS ``cfg`` asks for.

    Raises:
        shards.tokenizers.TokenizerError: no kind reads it, or it lacks BOS/EOS (one line each).
    """
    file = read(cfg.path, cfg.kind)
    identity(build(file), cfg)
    return file


def trained_file(texts: list[str], cfg: TokenizerConfig, summary: ReadSummary | None = None) -> TokenizerFile:
    """The tokenizer of ``cfg.kind`` trained on ``texts``: sentencepiece (:func:`train_sentencepiece`, for
    ``auto`` too) or a byte-level BPE (:func:`train_byte_level_bpe`, ``hf``)."""
    if cfg.kind == hf_kind.KIND:
        file = hf_kind.trained(train_byte_level_bpe(texts, cfg, summary))
    else:
        file = TokenizerFile(spm_kind.KIND, spm_kind.FILE_NAME, train_sentencepiece(texts, cfg, summary))
    got = build(file).vocab_size
    if got < cfg.vocab_size:  # both trainers stop early when the sample has no more merges to make
        print(f"note: the trained tokenizer has {got:,} pieces, fewer than tokenizer.vocab_size={cfg.vocab_size:,}: "
              "the sample holds too little text for more (more input, or a smaller tokenizer.vocab_size)",
              file=sys.stderr, flush=True)
    return file


def build_model(sizes, select, cfg: TokenizerConfig, label: str = "Tokenizer", summary=None,
                given: TokenizerFile | None = None):
    """Singleton PCollection of the :class:`~shards.tokenizers.TokenizerFile`: ``given`` (the one at
    ``cfg.path``, read already), the one at ``cfg.path``, or one trained on a sample of the documents
    (:func:`trained_file`).

    The sample is taken in two steps, so no step holds more text than the sample: the
    :class:`~pipelines.stages.tokenizer_sample.SampleLimit` from hashes and sizes (:class:`SampleCutoff`, one
    side input), then :class:`SmallestHashSample` over the texts it admits. The sample, hence the model, is the
    one :class:`SmallestHashSample` gives over every text (``tests/unit/pipelines/test_tokenizer_sample.py``).

    Args:
        sizes: PCollection of :class:`~pipelines.stages.tokenizer_sample.SampleSize`, one per document.
        select: ``select(limit)``: the PCollection of ``(content hash, text)`` of the documents that
            ``limit`` (a singleton side input of the :class:`SampleLimit`) admits (the job reads them
            back from the split records: the texts never cross a global step in full).
        cfg: the tokenizer settings.
        label: prefix of the steps' labels.
        summary: optional singleton PCollection of :class:`~pipelines.accounting.read_summary.ReadSummary`,
            which explains an empty sample in the error.
        given: the tokenizer at ``cfg.path``, read already.
    Returns:
        the singleton PCollection.
    Raises:
        shards.tokenizers.TokenizerError: the given tokenizer cannot be read or lacks BOS/EOS.
    """
    if given is None and cfg.path:
        given = given_tokenizer(cfg)
    if given is not None:
        return sizes.pipeline | f"{label}/Load" >> beam.Create([given])
    limit = (sizes
             | f"{label}/Cutoff" >> beam.CombineGlobally(SampleCutoff(cfg.sample_max_bytes, cfg.sample_fraction))
             .with_fanout(SAMPLE_FANOUT))
    return (select(beam.pvalue.AsSingleton(limit))
            | f"{label}/Sample" >> beam.CombineGlobally(SmallestHashSample(cfg.sample_max_bytes, cfg.sample_fraction))
            | f"{label}/Train" >> beam.Map(trained_file, cfg,
                                           None if summary is None else beam.pvalue.AsSingleton(summary)))


class TokenizeFn(beam.DoFn):
    """A batch (list) of :class:`Doc` → one list of :class:`~pipelines.records.TokenizedDoc`, each
    document's ids framed by BOS and EOS as ``cfg`` asks (:func:`identity`).

    A document that encodes to no token at all (only characters the normaliser removes) is not
    a sample: it is counted as ``filtered:no_tokens`` (tag ``events``).

    Batches (``beam.BatchElements`` upstream) amortise the per-element cost of the runner for
    the big payloads that follow. The tokenizer arrives as a singleton side input; it is built once
    per DoFn instance (side inputs are not readable in ``setup``) and reused.

    Args:
        cfg: the tokenizer settings (``add_bos``, ``add_eos``).
    """

    def __init__(self, cfg: TokenizerConfig):
        self._cfg = cfg

    def setup(self):
        """Per-instance state: no tokenizer yet (it comes with the side input) and a progress bar."""
        self._key = None
        self._bar = tqdm(desc="tokenize", unit=" doc", mininterval=2.0, delay=2.0, leave=False,
                         disable=None)  # no bar when stderr is not a terminal

    def teardown(self):
        """Close the progress bar."""
        self._bar.close()

    def start_bundle(self):
        """A fresh event tally for the bundle."""
        self.tally = EventTally()

    def _tokenizer(self, file: TokenizerFile) -> Tokenizer:
        """The tokenizer of ``file``, built on the first bundle that brings it (keyed by kind and size:
        hashing megabytes per bundle would cost more than the check is worth)."""
        key = (file.kind, len(file.data))
        if key != self._key:
            self._tok = build(file)
            ids = identity(self._tok, self._cfg)
            self._head = [ids.bos_id] if ids.add_bos else []
            self._tail = [ids.eos_id] if ids.add_eos else []
            self._dtype = token_dtype(self._tok.vocab_size)
            self._key = key
        return self._tok

    def process(self, docs: list[Doc], file: TokenizerFile):
        """Encode a batch of :class:`Doc` with the tokenizer of ``file`` (side input).

        Yields one list of :class:`~pipelines.records.TokenizedDoc` (tokens: 1-D uint16 when the
        vocabulary fits, else uint32; BOS first and EOS last when asked); documents with no token
        are counted ``filtered:no_tokens`` and left out. Raises
        :class:`~shards.format.tokens.TokenRangeError` for an id at or above the tokenizer's
        ``vocab_size`` (it would be written beside a manifest that says it cannot occur). Encodes ``ENCODE_DOCS`` documents at a time
        (the library's batch call), so their token lists never exist for the whole batch."""
        tok = self._tokenizer(file)
        head, tail = self._head, self._tail
        out = []
        for start in range(0, len(docs), ENCODE_DOCS):
            part = docs[start:start + ENCODE_DOCS]
            for doc, t in zip(part, tok.encode_batch([doc.text for doc in part])):
                if t:
                    ids = head + t + tail if head or tail else t
                    try:
                        tokens = np.asarray(ids, dtype=self._dtype)
                    except OverflowError:  # an id past uint16, which the vocabulary said would do
                        tokens = np.asarray(ids, dtype=np.int64)
                    check_token_ids(tokens, tok.vocab_size, f"document {doc.id} as tokenized by the {tok.kind} "
                                    f"tokenizer (vocab_size {tok.vocab_size})")
                    out.append(TokenizedDoc(doc, tokens))
                else:
                    self.tally.add(doc.source, "filtered:no_tokens")
        self._bar.update(len(docs))
        yield out

    def finish_bundle(self):
        """Emit the bundle's event counts on tag ``events``."""
        yield from self.tally.flush()
