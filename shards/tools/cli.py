"""``python -m shards``: list, inspect, verify, index, reshard and extract shards.

PATH arguments are shard files (``.tar``), dataset folders holding ``manifest.json``, or
manifest files; a folder stands for all shards its manifest lists. Run
``python -m shards COMMAND -h`` for each command's options.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tarfile
from collections import Counter

import numpy as np

from colaflow.errors import exit_status, explain
from colaflow.wording import count, help_text, plural
from shards.format.keys import escape_key
from shards.format.blocks import BLOCK_LAYOUT, META_SUFFIX, block_documents, decode_meta, decode_meta_dict, is_block
from shards.format.sample import count_tokens, zstd_decompress
from shards.io.index import (
    WIDS_FILE,
    build_shard_index,
    dali_index_path,
    read_sample,
    write_dali_index,
    write_wids_index,
)
from shards.io.reader import ReadStats, ShardError, decode_sample, iter_raw, iter_samples
from shards.tools.reshard import reshard
from shards.tools.validate import VerifyConfig, resolve, verify_paths

_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def _size(text: str) -> int:
    """``"64M"`` → 64_000_000, ``"1Gi"`` → 2**30, ``"5000"`` → 5000 (bytes)."""
    t = text.strip().lower().removesuffix("b")
    for unit in sorted(_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * _UNITS[unit])
    return int(float(t))


def _tokenizer(arg: str | None, path: str):
    """The tokenizer (:mod:`shards.tokenizers`) of ``--tokenizer`` or of the manifest beside ``path``, else None;
    a note on stderr when ``--tokenizer`` is not the file the manifest's sha256 names.

    Raises:
        shards.tokenizers.TokenizerError: no kind reads ``--tokenizer``, or the manifest's changed.
    """
    from shards.tokenizers import build, of_shards, read

    [(_, _, manifest)] = resolve([path])
    if arg is not None:
        file = read(arg)
        ident = None if manifest is None else manifest.tokenizer_identity
        if ident is not None and ident.sha256 and ident.sha256 != file.sha256:
            print(f"note: --tokenizer {arg} is not the tokenizer these shards were written with (sha256 "
                  f"{file.sha256[:12]}..., the manifest says {ident.sha256[:12]}...): the text shown is what it makes "
                  "of their ids; leave --tokenizer out to use the shards' own", file=sys.stderr)
        return build(file)
    if manifest is None:
        return None
    file = of_shards(path if os.path.isdir(path) else os.path.dirname(path) or ".", manifest)
    return None if file is None else build(file)


def _show(sample: dict, sp, out) -> None:
    print(f"== {sample['__key__']}", file=out)
    for name, value in sample.items():
        if name == "__key__":
            continue
        if isinstance(value, np.ndarray):
            head = " ".join(str(int(x)) for x in value[:16])
            print(f"  {name}: {value.dtype}[{value.size}] {head}{' ...' if value.size > 16 else ''}", file=out)
            if sp is not None and name == "tokens" and value.size and int(value.max()) >= sp.vocab_size:
                print(f"  {name} (detokenised): not shown: id {int(value.max()):,} is beyond the tokenizer's "
                      f"{sp.vocab_size:,} ids, so it is not the tokenizer these shards were written with", file=out)
            elif sp is not None and name == "tokens":
                print(f"  {name} (detokenised): {sp.decode(value.tolist())[:500]!r}", file=out)
        elif isinstance(value, bytes):
            print(f"  {name}: {len(value)} bytes", file=out)
        elif isinstance(value, str):
            print(f"  {name}: {value[:500]!r}", file=out)
        else:
            print(f"  {name}: {json.dumps(value, ensure_ascii=False)[:500]}", file=out)


def _unusable_path(paths: list[str]) -> str | None:
    """One-line error for the first local path in ``paths`` that does not exist, or that is a folder
    holding neither ``manifest.json`` nor a ``.tar`` shard; None when all are usable (URLs are not
    checked here: reading them reports their own error)."""
    for p in paths:
        if "://" in p:
            continue
        if not os.path.exists(p):
            return f"path not found: {p}"
        if os.path.isdir(p) and not any(n == "manifest.json" or n.endswith(".tar") for n in os.listdir(p)):
            return (f"error: no manifest.json (and no shard) in {p}; write a dataset there with "
                    f"python beam_runner.py --input ... --output {p}, or point at the folder it wrote")
    return None


def cmd_ls(args) -> int:
    """``ls PATHS``: shards of a dataset (manifest entries; a shard the manifest does not list shows
    only its file size), or each member (data offset, size, name) of a ``.tar``. Returns 0, or 1 when
    a path does not exist or is a folder with no manifest.json and no shard."""
    error = _unusable_path(args.paths)
    if error:
        print(error, file=sys.stderr)
        return 1
    for path in args.paths:
        if path.endswith(".tar"):
            with tarfile.open(path, "r:") as tar:
                for ti in tar:
                    print(f"{ti.offset_data:>12} {ti.size:>10} {ti.name}")
            continue
        items = resolve([path])
        listed = [e for _, e, _ in items if e is not None]
        unlisted = [p for p, e, _ in items if e is None]
        for shard, entry, _ in items:
            if entry is None:
                print(f"{os.path.basename(shard)}  (not in a manifest) file bytes={os.path.getsize(shard)}")
            else:
                print(f"{entry.name}  samples={entry.samples} tokens={entry.tokens} bytes={entry.bytes}")
        print(f"{count(len(items), 'shard')}, {count(sum(e.samples for e in listed), 'sample')}, "
              f"{count(sum(e.tokens for e in listed), 'token')}, {count(sum(e.bytes for e in listed), 'byte')}"
              + (f" ({count(len(unlisted), 'shard')} not in a manifest, not counted; "
                 f"colaflow shards stats {path} reads them)" if unlisted else ""))
    return 0


def _is_block(sample: dict) -> bool:
    return isinstance(sample.get("json"), dict) and sample["json"].get("layout") == BLOCK_LAYOUT


def _documents(samples):
    """Samples with token blocks expanded into their documents (see :func:`shards.format.blocks.block_documents`)."""
    for sample in samples:
        yield from block_documents(sample) if _is_block(sample) else [sample]


def _one_shard(path: str) -> str:
    """The shard to inspect for ``path``: ``path`` itself for a ``.tar``, else the first shard of the
    dataset folder or manifest (named on stderr, with how to pick another).

    Raises:
        FileNotFoundError: a local path that does not exist; ValueError: a dataset with no shards.
    """
    if not (os.path.isdir(path) or path.endswith("manifest.json")):
        return path
    items = resolve([path])
    if not items:
        raise ValueError(f"{path}: a dataset with no shards; nothing to inspect")
    print(f"# {path} is a dataset of {count(len(items), 'shard')}; inspecting the first, {items[0][0]} "
          f"(pass a shard to pick another; list them with: colaflow shards ls {path})", file=sys.stderr)
    return items[0][0]


def _at_least_one(text: str) -> int:
    """``--limit`` values: an integer >= 1; anything else is a usage error (argparse exits 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {n}")
    return n


def cmd_inspect(args) -> int:
    """``inspect SHARD``: print decoded documents (a block is shown document by document), detokenised
    when a tokenizer is found; a dataset folder or manifest inspects its first shard. Returns 0, or 1
    when ``--key`` names no document of the shard."""
    args.shard = _one_shard(args.shard)
    sp = _tokenizer(args.tokenizer, args.shard)
    if args.at is not None:
        sample = read_sample(args.shard, args.at)
        if _is_block(sample):
            documents = len(decode_meta_dict(sample["json"], sample["__key__"]).ids)
            print(f"== block {sample['__key__']}: {documents} documents, "
                  f"{sample['tokens'].size} {sample['tokens'].dtype} tokens")
        for doc in _documents([sample]):
            _show(doc, sp, sys.stdout)
        return 0
    shown = 0
    # the sample key, or the document id it escapes (a WARC page's id is its URL: a long one's key is a hash)
    keys = {args.key, escape_key(args.key)} if args.key else set()
    for sample in _documents(iter_samples(args.shard)):
        if args.key and sample["__key__"] not in keys:
            continue
        _show(sample, sp, sys.stdout)
        shown += 1
        if shown >= args.limit:
            break
    if args.key and not shown:
        print(f"error: {args.shard} has no document with key or id {args.key!r}; colaflow shards inspect "
              f"{args.shard} lists its keys", file=sys.stderr)
        return 1
    return 0


def _faults(counts: Counter) -> str:
    """Fault counts as text, most frequent first: ``"undecodable 1, bad_tokens 3"``."""
    return ", ".join(f"{kind} {n:,}" for kind, n in counts.most_common())


def cmd_verify(args) -> int:
    """``verify PATHS``: check shards against the spec and the manifest (checksums, token counts,
    block lengths); prints one line per faulty shard. Returns 0 when all pass, 1 otherwise: a fault, or
    nothing to verify (a one-line error when a local path does not exist, is a folder with no
    manifest.json and no shard, or its manifest lists no shard)."""
    error = _unusable_path(args.paths)
    if error:
        print(error, file=sys.stderr)
        return 1
    logging.getLogger("shards").setLevel(logging.ERROR)  # faults are printed below, per shard
    cfg = VerifyConfig(strict=not args.lenient, schema=args.schema, checksums=not args.no_checksums)
    reports = verify_paths(args.paths, cfg, progress=not args.quiet)
    faults: Counter = Counter()
    for rep in reports:
        faults.update(rep.stats.counts)
        if rep.stats.messages:
            print(f"{'FAIL' if not rep.ok else 'WARN'} {rep.path}", file=sys.stderr)
            for msg in rep.stats.messages[:20]:
                print(f"  {msg}", file=sys.stderr)
    bad = [r for r in reports if not r.ok]
    tokenizer_faults = _tokenizer_faults(args.paths)
    for line in tokenizer_faults:
        print(f"FAIL {line}", file=sys.stderr)
    print(f"verified {count(len(reports), 'shard')} ({'strict' if cfg.strict else 'lenient'}): "
          f"{len(reports) - len(bad):,} ok, {len(bad):,} failed; {count(sum(r.samples for r in reports), 'sample')}, "
          f"{count(sum(r.tokens for r in reports), 'token')}"
          + (f"; faults: {_faults(faults)}" if faults else "")
          + ("; the tokenizer failed its check" if tokenizer_faults else ""))
    if not reports:
        print(f"error: no shard to verify in {' '.join(args.paths)} (its manifest lists none)", file=sys.stderr)
        return 1
    if bad:
        print("next: re-download or regenerate the failed shards, or read them with lenient mode", file=sys.stderr)
    return 1 if bad or tokenizer_faults else 0


def _tokenizer_faults(paths: list[str]) -> list[str]:
    """One line per dataset among ``paths`` whose tokenizer file is missing or differs from the
    manifest's sha256 (:func:`shards.tokenizers.of_shards`)."""
    from shards.tokenizers import TokenizerError, of_shards

    faults, seen = [], set()
    for shard_path, _, manifest in resolve(paths):
        folder = os.path.dirname(shard_path) or "."
        if manifest is None or folder in seen:
            continue
        seen.add(folder)
        try:
            of_shards(folder, manifest)
        except TokenizerError as e:
            faults.append(str(e))
    return faults


def cmd_stats(args) -> int:
    """``stats PATHS``: samples, documents, tokens, bytes per token and bytes per field. Returns 0."""
    stats, n_shards, tok, file_bytes = ReadStats(), 0, [], 0
    field_bytes: Counter = Counter()
    for path, _, _ in resolve(args.paths):
        n_shards += 1
        file_bytes += os.path.getsize(path) if "://" not in path else 0
        for key, fields in iter_raw(path, stats=stats):
            stats.samples += 1
            for suffix, data in fields.items():
                field_bytes[suffix] += len(data)
            if is_block(fields):
                tok.extend(decode_meta(fields[META_SUFFIX], f"{path}: block {key!r}").lengths.tolist())
            else:
                tok.extend(count_tokens(s, d) for s, d in fields.items() if s.startswith("tokens.npy"))
    print(f"shards: {n_shards}  samples: {stats.samples}  documents: {len(tok)}  member bytes: "
          f"{sum(field_bytes.values())}  file bytes: {file_bytes}")
    for suffix, b in sorted(field_bytes.items()):
        print(f"  {suffix}: {b} bytes ({b / max(stats.samples, 1):.1f} per sample)")
    if tok:
        print(f"tokens: {sum(tok)}  per document min/mean/max: {min(tok)}/{sum(tok) / len(tok):.1f}/{max(tok)}"
              f"  shard bytes per token: {file_bytes / max(sum(tok), 1):.3f}")
    if stats.faults:
        print(f"faults (samples skipped): {_faults(stats.counts)}")
    return 0


def cmd_index(args) -> int:
    """``index PATHS``: write the wids JSON index and a DALI ``.idx`` beside each shard. Returns 0."""
    items = resolve(args.paths)
    out = args.out or os.path.join(os.path.dirname(items[0][0]) or ".", WIDS_FILE)
    base = os.path.dirname(os.path.abspath(out))
    indexes = []
    for path, _, _ in items:
        ix = build_shard_index(path, url=os.path.relpath(os.path.abspath(path), base))
        write_dali_index(ix, dali_index_path(path))
        indexes.append(ix)
    write_wids_index(indexes, out, args.name)
    print(f"indexed {count(len(indexes), 'shard')}, {count(sum(i.nsamples for i in indexes), 'sample')}: {out} and "
          f"{count(len(indexes), 'DALI .idx file')} beside the {plural(len(indexes), 'shard')}")
    return 0


def cmd_reshard(args) -> int:
    """``reshard PATHS --out DIR``: rewrite the samples into new shards by sample count or bytes,
    with a fresh manifest. Returns 0."""
    m = reshard(args.paths, args.out, max_samples=args.max_samples,
                max_bytes=_size(args.max_bytes) if args.max_bytes else None, prefix=args.prefix,
                progress=not args.quiet)
    print(f"wrote {count(len(m.shards), 'shard')}, {count(m.total_samples, 'sample')}, "
          f"{count(m.total_tokens, 'token')} to {args.out}")
    return 0


def cmd_cat(args) -> int:
    """``cat SHARD [MEMBER...]``: write member bytes to stdout (``--decompress`` for ``.zst``). In a token
    block a bare KEY is a document (its tokens, little-endian; a block's key is its first document's),
    KEY.SUFFIX a member of the block. Returns 0, or 1 when a named KEY or member is not in the shard."""
    want = set(args.members)
    found: set[str] = set()
    out = sys.stdout.buffer
    for key, fields in iter_raw(args.shard):
        if want and is_block(fields) and not any(f"{key}.{suffix}" in want for suffix in fields):
            for doc in block_documents(decode_sample(args.shard, key, fields)):
                if doc["__key__"] in want:
                    out.write(doc["tokens"].tobytes())
                    found.add(doc["__key__"])
            continue
        for suffix, data in fields.items():
            name = f"{key}.{suffix}"
            if want and name not in want and key not in want:
                continue
            found |= {name, key}
            if args.decompress and suffix.endswith(".zst"):
                data = zstd_decompress(data)
            out.write(data)
    out.flush()
    missing = sorted(want - found)
    if missing:
        print(f"error: {args.shard} has no sample, document or member {', '.join(map(repr, missing))}; "
              f"colaflow shards inspect {args.shard} lists its keys", file=sys.stderr)
        return 1
    return 0


def build_parser(prog: str = "python -m shards") -> argparse.ArgumentParser:
    """The argument parser with one subcommand per ``cmd_*`` function; ``prog`` is the command line its
    usage shows (``colaflow shards`` when run as that)."""
    p = argparse.ArgumentParser(prog=prog, description=help_text(__doc__.split("\n\n")[0]))
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ls", help="list shards of a dataset, or members (data offset, size, name) of a .tar")
    s.add_argument("paths", nargs="+")
    s.set_defaults(fn=cmd_ls)
    s = sub.add_parser("inspect", help="print decoded samples of a shard (a dataset folder or manifest: its first shard)")
    s.add_argument("shard", help="shard .tar, or a dataset folder / manifest.json (inspects its first shard)")
    s.add_argument("-n", "--limit", type=_at_least_one, default=5,
                   help="samples to print, 1 or more (default 5; 0 or negative is a usage error)")
    s.add_argument("--key", help="print only the document with this sample key or document id")
    s.add_argument("--at", type=int, help="random access: print sample number AT (uses the .idx beside the shard)")
    s.add_argument("--tokenizer", help="tokenizer file, folder or bundled encoding name (default: the manifest's)")
    s.set_defaults(fn=cmd_inspect)
    s = sub.add_parser("verify", help="check structure and sha256 against the manifest; exit 0 only if all pass",
                       description="Check shards' structure, sizes, sha256 and token counts against the spec "
                       "and the manifest. Exit 0: all pass; 1: a fault, or nothing to verify; 2: usage error.")
    s.add_argument("paths", nargs="+", help="dataset folders (holding manifest.json, or .tar shards), "
                   "manifest.json files, or .tar shards")
    s.add_argument("--lenient", action="store_true", help="skip and count faulty samples instead of failing")
    s.add_argument("--schema", default="auto", choices=["auto", "text", "image", "any"],
                   help="members each sample must have: text (tokens and json), image (jpg or png, and cls "
                   "or txt), any (no check); auto (default): text when the manifest names a tokenizer or "
                   "counts tokens, else any")
    s.add_argument("--no-checksums", action="store_true", help="skip size/sha256 comparison")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_verify)
    s = sub.add_parser("stats", help="sample, byte and token statistics")
    s.add_argument("paths", nargs="+")
    s.set_defaults(fn=cmd_stats)
    s = sub.add_parser("index", help="write DALI .idx files beside the shards and a wids shardindex.json")
    s.add_argument("paths", nargs="+")
    s.add_argument("--out", help=f"wids index path (default: {WIDS_FILE} beside the first shard)")
    s.add_argument("--name", help="dataset name recorded in the wids index")
    s.set_defaults(fn=cmd_index)
    s = sub.add_parser("reshard", help="copy samples into shards of a new size, with a new manifest")
    s.add_argument("paths", nargs="+")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--max-samples", type=int)
    s.add_argument("--max-bytes", help="e.g. 256M, 1Gi, 5000000")
    s.add_argument("--prefix", default="shard")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_reshard)
    s = sub.add_parser("cat", help="write member bytes to stdout (all, or the named KEY / KEY.SUFFIX); in a token "
                       "block a KEY is a document (its tokens, little-endian, the block's dtype) and KEY.SUFFIX a "
                       "member of the block; exit 1 when a name is not in the shard")
    s.add_argument("shard")
    s.add_argument("members", nargs="*")
    s.add_argument("-d", "--decompress", action="store_true", help="zstd-decompress .zst members")
    s.set_defaults(fn=cmd_cat)
    return p


def main(argv: list[str] | None = None, prog: str = "python -m shards") -> int:
    """Run the CLI on ``argv`` (``sys.argv[1:]`` when ``None``) with ``prog`` in its usage; returns the
    exit status (1 on a malformed shard or a missing/unreachable file, 2 on a usage or config error;
    see :func:`colaflow.errors.exit_status`)."""
    args = build_parser(prog).parse_args(argv)
    if args.cmd == "reshard" and not (args.max_samples or args.max_bytes):
        print("reshard: give --max-samples and/or --max-bytes", file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except (ShardError, tarfile.TarError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return exit_status(e)
