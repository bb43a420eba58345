"""Configuration of the preprocessing pipeline (``configs/pipeline.yaml``).

Loaded with :func:`colaflow.config.load_config`; every default works on a laptop, and the
curation defaults are FineWeb's (the demo corpus, verse, runs with ``quality.enabled=false``).
Override from the command line, e.g. ``tokenizer.vocab_size=8192``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from colaflow.config import ConfigError, check_fields, setting
from pipelines.stages.scorers import SCORERS
from shards.format.blocks import COMPRESSIONS
from shards.format.layouts import LAYOUTS
from shards.tokenizers import KINDS as TOKENIZER_KINDS

# tokenizer.kind values the pipeline trains when no tokenizer.path is given (auto: sentencepiece)
TRAINED_KINDS = ("auto", "sentencepiece", "hf")

@dataclass
class WarcConfig:
    """WARC input (``.warc``, ``.warc.gz``): how a response record's HTML becomes a document's text.

    Attributes:
        extractor: ``resiliparse`` (``resiliparse.extract.html2text.extract_plain_text``, fast) or
            ``trafilatura`` (``trafilatura.extract``: slower, main text only, boilerplate removed).
        main_content: resiliparse: keep only the main content (menus, footers, sidebars dropped).
        include_tables: keep the text of tables (both extractors).
        include_comments: trafilatura: keep the comment section of a page.
        favor: trafilatura: ``balanced``, ``precision`` (less text, less noise) or ``recall``.
        language: identify each page's language (py3langid, its first 2,000 characters) for the
            document's metadata; about three quarters of the reading time (BENCHMARKS.md). Off: "".
    """

    extractor: str = setting("resiliparse", choices=("resiliparse", "trafilatura"))
    main_content: bool = True
    include_tables: bool = True
    include_comments: bool = False
    favor: str = setting("balanced", choices=("balanced", "precision", "recall"))
    language: bool = True


@dataclass
class InputConfig:
    """How input files are read.

    Attributes:
        format: ``auto`` (by extension: ``.jsonl``/``.ndjson`` → jsonl, ``.txt``/``.text`` → text,
            ``.parquet`` → parquet, ``.warc`` → warc, anything else → ``unknown_files``), ``jsonl``,
            ``text``, ``parquet`` or ``warc`` (every matched file read so). ``.gz``/``.bz2``/``.zst``
            files are decompressed by extension.
        unknown_files: what ``format: auto`` does with any other file (``README.md``, ``.csv``,
            ``.json``): ``skip`` (default: counted as ``skipped_files`` in ``stats.json`` and named
            in a warning), ``error`` (refuse the run before it starts) or ``text`` (read as text).
        text_field: JSON field / Parquet column holding the document text.
        id_field: JSON field / Parquet column holding the document id. Ids are qualified by the
            file's path relative to the input root (``sub/a.jsonl/{id}``), so ids need only be
            unique within a file; a missing id becomes ``sub/a.jsonl#{line:08d}`` (line or Parquet
            row, 1-based), or ``sub/a.jsonl#@{byte offset:012d}`` for records of a split that does
            not start the file (line unknown there). See :func:`pipelines.records.qualify_id`.
        source_field: JSON field / Parquet column naming the source; missing → the file stem.
        split_bytes: uncompressed JSONL and ``.warc.gz`` files are read in byte ranges of this size (and
            Parquet in row groups up to this size) by different workers; other compressed files and text
            files in one piece, streamed.
        max_record_bytes: a line or paragraph longer than this (bytes) is skipped while reading,
            in 1 MiB steps (never held whole), and dead-lettered as ``too_large``.
        separator: text format only: a line equal to this ends a unit (e.g. ``%`` for fortune
            files); empty = units are paragraphs ended by blank lines.
        warc: WARC input's HTML extraction (:class:`WarcConfig`).
    """

    format: str = setting("auto", choices=("auto", "jsonl", "text", "parquet", "warc"))
    unknown_files: str = setting("skip", choices=("skip", "error", "text"))
    text_field: str = "text"
    id_field: str = "id"
    source_field: str = "source"
    split_bytes: int = setting(16_000_000, ge=1)
    max_record_bytes: int = setting(16_000_000, ge=1)
    separator: str = ""
    warc: WarcConfig = field(default_factory=WarcConfig)


@dataclass
class CleanConfig:
    """Text normalisation.

    Attributes:
        fix_unicode: repair mojibake and other broken Unicode with ``ftfy.fix_text`` before
            normalising (Speer 2019, ftfy); ANSI escapes are removed first so ftfy never sees them.
        normalization: Unicode normal form (``NFC``, ``NFKC``, ...; UAX #15).
        strip_control: remove ANSI escape sequences, C0/C1 control characters (``\\n``/``\\t``
            kept), NUL and the BOM.
        whitespace: ``trim`` (trailing spaces of lines and surrounding whitespace removed),
            ``collapse`` (also: runs of spaces/tabs and Unicode spaces → one space, 3+ newlines → 2)
            or ``keep`` (only surrounding whitespace removed).
        min_chars: documents shorter than this after cleaning are filtered as ``empty``/``too_short``.
        max_chars: documents longer than this are filtered as ``too_long``; checked on the raw text
            too, before any cleaning work, so huge documents cost no more than their reading.
    """

    fix_unicode: bool = True
    normalization: str = setting("NFC", choices=("NFC", "NFKC", "NFD", "NFKD"))
    strip_control: bool = True
    whitespace: str = setting("trim", choices=("trim", "collapse", "keep"))
    min_chars: int = setting(1, ge=0)
    max_chars: int = setting(5_000_000, ge=1)


@dataclass
class LanguageConfig:
    """Language identification with ``py3langid`` (Lui & Baldwin 2012, langid.py; the model ships
    inside the wheel, nothing is downloaded). Off by default.

    Attributes:
        enabled: identify and filter.
        allowed: ISO 639-1 codes to keep (e.g. ``[en, zh]``); empty = keep every language.
        threshold: minimum normalised probability of the top language; below it → ``filtered:lang_unsure``.
        max_chars: only the first this many characters are classified (bounded cost per document).
    """

    enabled: bool = False
    allowed: list[str] = field(default_factory=lambda: ["en"])
    threshold: float = setting(0.5, ge=0.0, le=1.0)
    max_chars: int = setting(2000, ge=1)


@dataclass
class GopherQualityConfig:
    """Gopher's quality rules (Rae et al. 2021, "Scaling Language Models", appendix A.1.1); the
    defaults are the paper's thresholds. Words are whitespace-separated.

    Attributes:
        enabled: apply these rules (when ``quality.enabled``).
        min_words / max_words: word-count range (Gopher: 50..100000).
        min_mean_word_len / max_mean_word_len: mean word length in characters (Gopher: 3..10).
        max_hash_ratio: ``#`` characters per word (Gopher: 0.1).
        max_ellipsis_ratio: ellipses (``...``, ``…``) per word (Gopher: 0.1), tested apart from ``#``.
        max_bullet_lines: fraction of lines starting with a bullet (Gopher: 0.9).
        max_ellipsis_lines: fraction of lines ending with an ellipsis (Gopher: 0.3).
        min_alpha_words: fraction of words holding a letter (Gopher: 0.8).
        min_stop_words: distinct English stop words required (Gopher: 2 of the, be, to, of, and,
            that, have, with).
    """

    enabled: bool = True
    min_words: int = setting(50, ge=0)
    max_words: int = setting(100_000, ge=1)
    min_mean_word_len: float = setting(3.0, ge=0)
    max_mean_word_len: float = setting(10.0, gt=0)
    max_hash_ratio: float = setting(0.1, ge=0)
    max_ellipsis_ratio: float = setting(0.1, ge=0)
    max_bullet_lines: float = setting(0.9, ge=0.0, le=1.0)
    max_ellipsis_lines: float = setting(0.3, ge=0.0, le=1.0)
    min_alpha_words: float = setting(0.8, ge=0.0, le=1.0)
    min_stop_words: int = setting(2, ge=0, le=8)


@dataclass
class RepetitionConfig:
    """Gopher's repetition rules (Rae et al. 2021, appendix A.1.1, table A1); the defaults are the
    paper's thresholds, and 1.0 turns a fraction off. Lines are the non-blank lines, paragraphs the
    blocks between blank lines, n-grams runs of n whitespace-separated words.

    Attributes:
        enabled: apply these rules (when ``quality.enabled``).
        max_dup_lines: fraction of lines that repeat an earlier line (Gopher: 0.30).
        max_dup_paragraphs: fraction of paragraphs that repeat an earlier paragraph (Gopher: 0.30).
        max_dup_line_chars: characters in repeated lines per character of the text (Gopher: 0.20).
        max_dup_paragraph_chars: characters in repeated paragraphs per character (Gopher: 0.20).
        max_top_ngram: ``{n: fraction}``: the words' characters in the most frequent n-gram (occurring
            at least twice) times its count, per character (Gopher: 2: 0.20, 3: 0.18, 4: 0.16).
        max_dup_ngram: ``{n: fraction}``: the characters of the words covered by the repeats (second
            and later occurrences) of every repeated n-gram, each word once, per character
            (Gopher: 5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10).
    """

    enabled: bool = True
    max_dup_lines: float = setting(0.30, ge=0.0, le=1.0)
    max_dup_paragraphs: float = setting(0.30, ge=0.0, le=1.0)
    max_dup_line_chars: float = setting(0.20, ge=0.0, le=1.0)
    max_dup_paragraph_chars: float = setting(0.20, ge=0.0, le=1.0)
    max_top_ngram: dict = field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    max_dup_ngram: dict = field(default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10})


@dataclass
class C4Config:
    """C4's rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning", section 2.2).
    Line rules drop the line and keep the rest of the document; document rules drop the document.

    Attributes:
        enabled: apply these rules (when ``quality.enabled``).
        terminal_punct: drop lines not ending in ``.``, ``!``, ``?`` or a closing quote, or ending in
            ``...`` (C4: on; off by default, as in FineWeb, Penedo et al. 2024, which left it out
            because it removes a large share of the tokens).
        min_words_per_line: drop lines of fewer words (C4: 3; 0 = off).
        max_word_len: drop lines holding a longer word, in characters (C4's code: 1000; 0 = off).
        javascript: drop lines mentioning "javascript" (C4).
        policy: drop lines about terms of use, privacy or cookie policies (C4's code).
        lorem_ipsum: drop documents holding "lorem ipsum" in a kept line (C4).
        curly_brace: drop documents holding ``{`` in a kept line (C4).
        min_sentences: drop documents with fewer sentences in their kept lines (C4: 5; 0 = off).
        bad_words: a word list: a file (one word or phrase per line, local path or fsspec URL) or a
            named list of :data:`pipelines.stages.quality.word_lists.NAMED_LISTS` (``better-profanity``,
            ``pip install 'colaflow[curation]'``). Drop documents whose kept lines hold one as a whole
            word, case ignored (C4). C4 used the "List of Dirty, Naughty, Obscene and Otherwise Bad
            Words" (``en``), which no maintained package ships. ``null`` = off (FineWeb leaves it out).
    """

    enabled: bool = True
    terminal_punct: bool = False
    min_words_per_line: int = setting(3, ge=0)
    max_word_len: int = setting(1000, ge=0)
    javascript: bool = True
    policy: bool = True
    lorem_ipsum: bool = True
    curly_brace: bool = True
    min_sentences: int = setting(5, ge=0)
    bad_words: str | None = None


@dataclass
class FineWebConfig:
    """FineWeb's extra rules (Penedo et al. 2024, "The FineWeb Datasets", section 3.5; the newline
    rule from its code, datatrove's ``FineWebQualityFilter``). Lines are the non-blank lines.

    Attributes:
        enabled: apply these rules (when ``quality.enabled``).
        min_line_punct: fraction of lines ending in terminal punctuation required (FineWeb: 0.12).
        max_short_lines: fraction of lines of at most ``short_line_chars`` characters (FineWeb: 0.67).
        short_line_chars: what a short line is, in characters (FineWeb: 30).
        max_dup_line_chars: characters in repeated lines per character of the text, newlines not
            counted (FineWeb paper: 0.1; datatrove's default is 0.01).
        max_newline_ratio: newlines per word (FineWeb's code: 0.3).
    """

    enabled: bool = True
    min_line_punct: float = setting(0.12, ge=0.0, le=1.0)
    max_short_lines: float = setting(0.67, ge=0.0, le=1.0)
    short_line_chars: int = setting(30, ge=0)
    max_dup_line_chars: float = setting(0.1, ge=0.0, le=1.0)
    max_newline_ratio: float = setting(0.3, ge=0.0)


@dataclass
class QualityConfig:
    """Heuristic quality rules of Gopher, C4 and FineWeb, in that order (``pipelines.stages.quality``).
    On by default with FineWeb's set (Penedo et al. 2024: Gopher quality and repetition, C4 without
    its terminal-punctuation rule and bad-words list, FineWeb's own rules), so the default run gives
    a corpus a team would train on. These are web-text thresholds: ``quality.enabled=false`` for
    short texts such as verse (the demo corpus turns them off).

    Attributes:
        enabled: apply the sections below (each has its own ``enabled`` too).
        gopher: Gopher's quality rules.
        repetition: Gopher's repetition rules.
        c4: C4's line and document rules.
        fineweb: FineWeb's rules.
    """

    enabled: bool = True
    gopher: GopherQualityConfig = field(default_factory=GopherQualityConfig)
    repetition: RepetitionConfig = field(default_factory=RepetitionConfig)
    c4: C4Config = field(default_factory=C4Config)
    fineweb: FineWebConfig = field(default_factory=FineWebConfig)


@dataclass
class ClassifierConfig:
    """A model-based quality filter (``pipelines.stages.classifier``), as DCLM and FineWeb-Edu filter
    with one. Off unless ``path`` is given.

    Attributes:
        kind: the model (:data:`pipelines.stages.scorers.SCORERS`): ``fasttext`` (a ``.bin``,
            ``colaflow[curation]``) or ``hf`` (a Hugging Face sequence-classification model, torch).
        path: the model: a fastText ``.bin`` (local path or fsspec URL), or a local folder saved by
            ``save_pretrained`` (the model and its tokenizer) for ``hf``; ``null`` = no classifier.
        label: the label whose probability is the document's score (``__label__hq`` for fastText;
            one of the model's ``id2label`` names for ``hf``).
        threshold: documents scored below this are filtered as ``quality_classifier``.
        batch_size: ``hf``: texts per forward pass.
        max_tokens: ``hf``: each text's first this many tokens are scored.
    """

    kind: str = setting("fasttext", choices=tuple(SCORERS))
    path: str | None = None
    label: str = "__label__hq"
    threshold: float = setting(0.5, ge=0.0, le=1.0)
    batch_size: int = setting(32, ge=1)
    max_tokens: int = setting(512, ge=1)


@dataclass
class DecontamConfig:
    """Benchmark decontamination (``pipelines.stages.decontam``): n-gram overlap with evaluation sets,
    as GPT-3 (Brown et al. 2020, appendix C). Off while ``eval_sets`` is empty.

    Attributes:
        eval_sets: ``{name: path or glob}`` of evaluation files (JSONL, Parquet or text, optionally
            compressed; every string field of a record is evaluation text). The name appears in
            reasons (``decontam_<name>``), so letters, digits, ``_``, ``-`` and ``.`` only.
        ngram: words per n-gram (GPT-3: 13); words are lower-cased ``\\w+`` runs.
        action: ``drop`` the matching documents, or ``cut`` the matching spans and keep the rest.
    """

    eval_sets: dict = field(default_factory=dict)
    ngram: int = setting(13, ge=1)
    action: str = setting("drop", choices=("drop", "cut"))


@dataclass
class PIIConfig:
    """PII redaction: matches are replaced by placeholders and counted per kind.

    Attributes:
        enabled: redact at all.
        email / ip / phone: which kinds to redact (placeholders ``<EMAIL>``, ``<IP>``, ``<PHONE>``).
    """

    enabled: bool = True
    email: bool = True
    ip: bool = True
    phone: bool = True


@dataclass
class DedupConfig:
    """Deduplication.

    Attributes:
        exact: drop documents whose normalised text (casefolded, whitespace collapsed) hashes equal;
            the keeper is the smallest id.
        write_duplicates: list every dropped duplicate with the id it duplicates in
            ``OUT/duplicates/*.jsonl`` (``{"id", "source", "duplicate_of", "kind"}``).
        near: MinHash-LSH near-duplicate removal (Broder 1997; Leskovec et al., "Mining of
            Massive Datasets", ch. 3.4); on by default, as in FineWeb, whose MinHash settings
            (word 5-grams, 112 hashes in 14 bands) are the defaults below.
        ngram: word shingle size for MinHash.
        num_perm: MinHash permutations (= bands * rows).
        bands: LSH bands; rows per band = num_perm / bands.
        threshold: estimated Jaccard similarity at or above which a candidate is a near-duplicate.
        near_rounds: large-star/small-star rounds of the near-duplicate clustering (connected
            components, Kiveris et al. 2014). A chain of ``n`` near-copies whose ids are in chain
            order, the slowest case measured, needs ``ceil(log2(n - 1))`` (the default, 8, settles
            such chains of up to 257 documents; chains in random id order of 1,000 measured).
        near_resolve_max: label pairs still disagreeing after the last round (clusters the rounds did
            not finish) that are settled in one place and reported in ``stats.json``; more fail the
            run with a message to raise ``near_rounds``.
    """

    exact: bool = True
    write_duplicates: bool = True
    near: bool = True
    ngram: int = setting(5, ge=1)
    num_perm: int = setting(112, ge=1)
    bands: int = setting(14, ge=1)
    threshold: float = setting(0.8, gt=0.0, le=1.0)
    near_rounds: int = setting(8, ge=1)
    near_resolve_max: int = setting(100_000, ge=0)


@dataclass
class TokenizerConfig:
    """Tokenizer: one given (any kind of :mod:`shards.tokenizers`), or sentencepiece (Kudo & Richardson
    2018) trained on the input.

    Attributes:
        path: an existing tokenizer to use instead of training (``--tokenizer`` sets it): a sentencepiece
            ``.model``, a Hugging Face ``tokenizer.json`` or its folder, a tiktoken ``.tiktoken`` rank
            file, or a bundled tiktoken encoding name (``cl100k_base``).
        kind: which kind reads ``path``: ``auto`` (by its name, then by trying each), ``sentencepiece``,
            ``hf`` or ``tiktoken``. Without ``path``, the kind trained here: sentencepiece (``auto``,
            ``sentencepiece``) or a byte-level BPE (``hf``, its ids 0-2 ``<|endoftext|>`` (EOS),
            ``<|startoftext|>`` (BOS), ``<|pad|>``; no BOS unless ``add_bos``).
        add_eos: end every document with the tokenizer's EOS token (the model learns where documents
            end; in batches the last text token's label is the EOS, the EOS's own label is ignored).
        add_bos: start every document with BOS; ``None`` (the default): the tokenizer's own convention
            (an HF tokenizer's ``add_bos_token`` or post-processor; none for sentencepiece and tiktoken).
        vocab_size: target vocabulary size; the trainer may stop lower on tiny corpora.
        model_type: ``bpe`` or ``unigram`` (sentencepiece; the hf kind trains only ``bpe``). The
            settings below up to ``max_sentence_bytes`` are sentencepiece's.
        sample_fraction: a document joins the training sample when its content hash falls
            below this fraction of the hash space (deterministic sampling).
        sample_max_bytes: cap on the sample (UTF-8 bytes), filled in content-hash order.
        character_coverage: sentencepiece ``character_coverage``: the fraction of character
            occurrences the vocabulary must cover with its own pieces (0.9995 suits CJK, whose
            thousands of rare characters then fall back to bytes; 1.0 for small alphabets). The
            vocabulary must be larger than the characters this requires.
        byte_fallback: unknown characters become byte tokens instead of ``<unk>``.
        normalization_rule: sentencepiece normaliser: ``nmt_nfkc`` (folds full-width forms and
            CJK punctuation, newlines become spaces) or ``identity`` (tokens decode to the text).
        remove_extra_whitespaces: sentencepiece collapses runs of spaces and strips the ends.
        max_sentence_bytes: training lines longer than this (UTF-8 bytes) are cut into pieces of at
            most this size at spaces (sentencepiece's ``max_sentence_length`` would skip them
            whole), so long one-line documents reach training. Memory per line, not per corpus.
    """

    path: str | None = None
    kind: str = setting("auto", choices=("auto", *TOKENIZER_KINDS))
    add_eos: bool = True
    add_bos: bool | None = None
    vocab_size: int = setting(4096, ge=1)
    model_type: str = setting("bpe", choices=("bpe", "unigram"))
    sample_fraction: float = setting(0.5, gt=0.0, le=1.0)
    sample_max_bytes: int = setting(3_000_000, ge=1)
    character_coverage: float = setting(0.9995, gt=0.0, le=1.0)
    byte_fallback: bool = True
    normalization_rule: str = setting("nmt_nfkc", choices=("nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"))
    remove_extra_whitespaces: bool = True
    max_sentence_bytes: int = setting(4096, ge=1)


@dataclass
class ShardsConfig:
    """Shard layout.

    Attributes:
        prefix: shard file name prefix (``{prefix}-{index:06d}.tar``): letters, digits, ``.``, ``_``
            and ``-``, starting with a letter or digit (no folder, no glob character).
        target_bytes: approximate shard size; the shard count is derived from the total.
        num_shards: fixed shard count (0 = derive from ``target_bytes``).
        store_text: also store the cleaned text (``K.txt.zst``, or in a token block's metadata).
        write_index: write a DALI ``.idx`` per shard and the wids ``shardindex.json``.
        layout: ``token_blocks`` (many documents per tar sample, format 2, see
            ``docs/shard-format.md``) or ``documents`` (one sample per document, format 1).
        compression: token blocks' tokens: ``none`` (raw, memory-mapped by the loader) or
            ``zstd`` (one frame per block: smaller, decompressed per block when read).
        block_tokens: target tokens per block (documents are never split across blocks); 0 picks
            65,536 for raw blocks and 1,048,576 for zstd (compresses far better).
    """

    prefix: str = setting("shard", pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*")
    target_bytes: int = setting(8_000_000, ge=1)
    num_shards: int = setting(0, ge=0)
    store_text: bool = False
    write_index: bool = True
    layout: str = setting("token_blocks", choices=tuple(LAYOUTS))
    compression: str = setting("none", choices=COMPRESSIONS)
    block_tokens: int = setting(0, ge=0)


@dataclass
class SplitConfig:
    """Held-out validation split (see :mod:`pipelines.stages.split`).

    Attributes:
        val_fraction: fraction of kept documents, chosen by content hash (stable across reruns
            and runners), written as a separate shard set in ``OUT/val/`` (0 = no split).
    """

    val_fraction: float = setting(0.0, ge=0.0, lt=1.0)


@dataclass
class PipelineConfig:
    """Whole preprocessing pipeline configuration (sections as above)."""

    input: InputConfig = field(default_factory=InputConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    language: LanguageConfig = field(default_factory=LanguageConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    pii: PIIConfig = field(default_factory=PIIConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    split: SplitConfig = field(default_factory=SplitConfig)

    def validate(self) -> None:
        """Check every declared field (:func:`colaflow.config.check_fields`: the choices and ranges
        beside each field above) and the relations between fields, before a run.

        Raises:
            colaflow.config.ConfigError: (a ``ValueError``) one line naming the key, the bad value and
                the allowed values, e.g. ``input.unknown_files='eror': use one of skip, error, text``.
        """
        check_fields(self)
        for key in ("max_top_ngram", "max_dup_ngram"):
            table = getattr(self.quality.repetition, key)
            if not isinstance(table, dict) or not all(
                    type(n) is int and n >= 1 and isinstance(f, (int, float)) and 0 <= f <= 1 for n, f in table.items()):
                raise ConfigError(f"quality.repetition.{key}={table!r}: use a mapping of n-gram sizes (integers >= 1) "
                                  "to fractions in [0, 1], e.g. {2: 0.2, 3: 0.18}")
        if self.quality.c4.bad_words:
            # imported here: the quality steps import this module
            from pipelines.stages.quality.word_lists import word_list_path
            word_list_path(self.quality.c4.bad_words)
        sets = self.decontam.eval_sets
        if not isinstance(sets, dict) or not all(isinstance(k, str) and re.fullmatch(r"[\w.-]+", k)
                                                 and isinstance(v, str) and v for k, v in sets.items()):
            raise ConfigError(f"decontam.eval_sets={sets!r}: use a mapping of names (letters, digits, _ - .) to paths "
                              "or globs, e.g. {mmlu: evals/mmlu/*.jsonl}")
        if self.dedup.num_perm % self.dedup.bands:
            raise ConfigError(f"dedup.num_perm={self.dedup.num_perm} is not a multiple of dedup.bands="
                              f"{self.dedup.bands}: LSH needs num_perm = bands * rows")
        if not self.tokenizer.path and self.tokenizer.kind not in TRAINED_KINDS:
            raise ConfigError(f"tokenizer.kind={self.tokenizer.kind} needs tokenizer.path (or --tokenizer PATH, "
                              f"such as cl100k_base): only {' and '.join(TRAINED_KINDS[1:])} are trained here")
        if not self.tokenizer.path and self.tokenizer.kind == "hf" and self.tokenizer.model_type != "bpe":
            raise ConfigError(f"tokenizer.model_type={self.tokenizer.model_type} with tokenizer.kind=hf: the "
                              "tokenizer trained for hf is a byte-level BPE; set tokenizer.model_type=bpe, or "
                              "tokenizer.kind=sentencepiece for a unigram model")
        if self.tokenizer.add_bos not in (None, True, False):
            raise ConfigError(f"tokenizer.add_bos={self.tokenizer.add_bos!r}: use true, false or null (the "
                              "tokenizer's own convention)")
        g = self.quality.gopher
        if g.min_words > g.max_words or g.min_mean_word_len > g.max_mean_word_len:
            raise ConfigError(f"quality.gopher.min_words={g.min_words}..max_words={g.max_words}, "
                              f"min_mean_word_len={g.min_mean_word_len}..max_mean_word_len={g.max_mean_word_len}: "
                              "a minimum above its maximum filters every document")
        if self.clean.min_chars > self.clean.max_chars:
            raise ConfigError(f"clean.min_chars={self.clean.min_chars} > clean.max_chars={self.clean.max_chars}: "
                              "every document would be filtered")
