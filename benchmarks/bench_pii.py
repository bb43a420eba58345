"""PII redaction precision and recall on real documentation text with planted PII.

Text: the reStructuredText sources of the Python documentation as Debian ships them
(``apt-get install python3-doc``: ``/usr/share/doc/python3.11/html/_sources/**/*.rst.txt``,
497 files, 12 MB of prose, code blocks, C and shell examples). Every file gets a few planted
e-mail addresses, IPv4/IPv6 addresses and phone numbers (seeded, in formats people write,
some of which the patterns do not cover, e.g. ``555 123 4567``). Real hits are judged by
``benchmarks/pii_labels.json`` (hits reviewed by hand: real addresses and example addresses are
PII-shaped and count as true; message-ids, version numbers and section numbers as false);
a hit not in the labels is counted false.

Baseline: the patterns before issue 12 (IPv6 without word boundaries, HTML5 e-mail local part).

    .venv/bin/python benchmarks/bench_pii.py [--root DIR] [--show-unlabelled]
"""
from __future__ import annotations

import argparse
import glob
import ipaddress
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipelines.config import PIIConfig  # noqa: E402
from pipelines.stages.pii import find_pii  # noqa: E402

ROOT = "/usr/share/doc/python3.11/html/_sources"
LABELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pii_labels.json")
PLANTED_PER_FILE = 4

_OLD_EMAIL = re.compile(r"(?<![A-Za-z0-9.!#$%&'*+/=?^_`{|}~-])[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9]"
                        r"(?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+")
_OLD_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_OLD_IPV4 = re.compile(rf"(?<![\d.]){_OLD_OCTET}(?:\.{_OLD_OCTET}){{3}}(?![\d.]*\d)")
_OLD_IPV6 = re.compile(r"(?<![0-9A-Fa-f:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![0-9A-Fa-f:])")
_OLD_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){2,4}"
                        r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}|\d{3}[.-]\d{3}[.-]\d{4})(?!\w)")


def baseline_spans(text: str) -> list[tuple[str, int, int]]:
    """Spans the pre-issue-12 patterns replace (IPv6 candidates validated as they were)."""
    spans = [("email", m.start(), m.end()) for m in _OLD_EMAIL.finditer(text)]
    spans += [("ip", m.start(), m.end()) for m in _OLD_IPV4.finditer(text)]
    for m in _OLD_IPV6.finditer(text):
        try:
            ipaddress.IPv6Address(m.group(0))
            spans.append(("ip", m.start(), m.end()))
        except ValueError:
            pass
    spans += [("phone", m.start(), m.end()) for m in _OLD_PHONE.finditer(text)]
    return spans


def colaflow_spans(text: str) -> list[tuple[str, int, int]]:
    """``(kind, start, end)`` spans colaflow's current PII patterns redact in ``text``."""
    return [tuple(s) for s in find_pii(text, PIIConfig())]


def fake_pii(rng: random.Random) -> tuple[str, str]:
    """One planted item ``(kind, text)`` in a format people write."""
    first = rng.choice(["anna", "li", "jose", "omar", "kate", "ngozi", "yuki", "pierre"])
    last = rng.choice(["smith", "wang", "garcia", "haddad", "okafor", "tanaka", "dubois"])
    domain = rng.choice(["example.com", "mail.example.org", "uni-bonn.de", "corp.co.uk"])
    n = lambda k: "".join(rng.choice("0123456789") for _ in range(k))  # noqa: E731
    kind = rng.choice(["email", "ip", "phone"])
    if kind == "email":
        return kind, rng.choice([f"{first}.{last}@{domain}", f"{first}{n(2)}@{domain}",
                                 f"{first}_{last}+news@{domain}", f"{first.upper()}@{domain}"])
    if kind == "ip":
        if rng.random() < 0.5:
            return kind, ".".join(str(rng.randint(1 if i == 0 else 0, 223 if i == 0 else 255)) for i in range(4))
        groups = [f"{rng.randint(0, 0xffff):x}" for _ in range(8)]
        return kind, rng.choice([":".join(groups), f"2001:db8:{groups[2]}::{groups[7]}", f"fe80::{':'.join(groups[4:])}"])
    area, mid, end = f"{rng.randint(201, 989)}", f"{rng.randint(200, 999)}", n(4)
    return kind, rng.choice([f"+44 20 {n(4)} {n(4)}", f"+1 ({area}) {mid}-{end}", f"({area}) {mid}-{end}",
                             f"{area}-{mid}-{end}", f"+49 30 {n(6)}", f"+33 1 {n(2)} {n(2)} {n(2)} {n(2)}",
                             f"{area} {mid} {end}"])


def plant(text: str, rng: random.Random) -> tuple[str, list[tuple[str, int, int]]]:
    """Insert ``PLANTED_PER_FILE`` items after random spaces; returns the text and their spans."""
    spaces = [m.start() for m in re.finditer(r"(?<=\w) (?=\w)", text)]
    points = sorted(rng.sample(spaces, min(PLANTED_PER_FILE, len(spaces))))
    out, planted, pos, shift = [], [], 0, 0
    for p in points:
        kind, item = fake_pii(rng)
        out += [text[pos:p + 1], item, " "]
        start = p + 1 + shift
        planted.append((kind, start, start + len(item)))
        shift += len(item) + 1
        pos = p + 1
    out.append(text[pos:])
    return "".join(out), planted


def evaluate(finder, docs, labels) -> dict:
    """Counts of a span finder over planted documents: planted found/missed, real true/false hits."""
    c = {"planted": 0, "found": 0, "real_true": 0, "real_false": 0, "wrong_span": 0}
    false_hits: dict[str, int] = {}
    for text, planted in docs:
        hits = finder(text)
        exact = {(s, e) for _, s, e in hits}
        c["planted"] += len(planted)
        c["found"] += sum((s, e) in exact for _, s, e in planted)
        for kind, s, e in hits:
            if any((s, e) == (ps, pe) for _, ps, pe in planted):
                continue
            if any(s < pe and ps < e for _, ps, pe in planted):
                c["wrong_span"] += 1
            elif text[s:e] in labels["pii"]:
                c["real_true"] += 1
            else:
                c["real_false"] += 1
                false_hits[text[s:e]] = false_hits.get(text[s:e], 0) + 1
    true = c["found"] + c["real_true"]
    c["precision"] = true / max(1, true + c["real_false"] + c["wrong_span"])
    c["recall_planted"] = c["found"] / max(1, c["planted"])
    c["false_hits"] = false_hits
    return c


def main(argv=None) -> int:
    """Plant PII into real documentation text and print precision and recall of colaflow and the old patterns."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=ROOT, help="folder of .rst.txt files (Debian python3-doc)")
    ap.add_argument("--show-unlabelled", action="store_true", help="list colaflow's real hits missing from the labels")
    args = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.root, "**", "*.rst.txt"), recursive=True))
    if not files:
        print(f"error: no .rst.txt under {args.root}; run: apt-get install python3-doc", file=sys.stderr)
        return 2
    with open(LABELS, encoding="utf-8") as f:
        labels = {k: set(v) for k, v in json.load(f).items() if not k.startswith("_")}
    rng = random.Random(12)
    docs = [plant(open(p, encoding="utf-8").read(), rng) for p in files]
    print(f"{len(files)} files, {sum(len(t) for t, _ in docs) / 1e6:.1f} M chars, "
          f"{sum(len(p) for _, p in docs)} planted items")
    if args.show_unlabelled:
        seen = {t[s:e] for t, planted in docs for _, s, e in colaflow_spans(t)
                if not any(s < pe and ps < e for _, ps, pe in planted)}
        print(json.dumps(sorted(seen - labels["pii"] - labels["not_pii"]), indent=1))
    print("| redactor | planted found | recall (planted) | real hits true / false | wrong spans | precision |")
    print("|---|---|---|---|---|---|")
    results = {}
    for name, finder in (("before issue 12", baseline_spans), ("colaflow", colaflow_spans)):
        r = results[name] = evaluate(finder, docs, labels)
        print(f"| {name} | {r['found']}/{r['planted']} | {r['recall_planted']:.3f} | {r['real_true']} / "
              f"{r['real_false']} | {r['wrong_span']} | {r['precision']:.3f} |")
    worst = sorted(results["colaflow"]["false_hits"].items(), key=lambda kv: -kv[1])
    print("colaflow false hits on real text:", ", ".join(f"{k!r} x{v}" for k, v in worst) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
