"""Reading shards: a streaming iterator of decoded samples.

Members are grouped into samples by key (name up to the first dot); members of one
sample must be adjacent. Every error names the shard and the member.
"""
from __future__ import annotations

import tarfile
from typing import Iterator

from .sample import decode_member


class ShardError(Exception):
    """A shard is malformed; the message names the shard and member."""


def _split(name: str) -> tuple[str, str]:
    key, dot, suffix = name.partition(".")
    return key, suffix


def iter_raw(path: str, fileobj=None) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield ``(key, {suffix: bytes})`` per sample, in file order, without decoding.

    Raises:
        ShardError: truncated or corrupt tar, a member without a suffix, a key whose
            members are not adjacent, or a duplicate member.
    """
    seen: set[str] = set()
    key, fields = None, {}
    member = "<header>"
    try:
        with tarfile.open(name=None if fileobj else path, fileobj=fileobj, mode="r|") as tar:
            for ti in tar:
                member = ti.name
                if not ti.isfile():
                    continue
                k, suffix = _split(ti.name.rsplit("/", 1)[-1])
                if "/" in ti.name:
                    k = ti.name.rsplit("/", 1)[0] + "/" + k
                if not suffix:
                    raise ShardError(f"{path}: member {ti.name!r} has no field suffix")
                if k != key:
                    if key is not None:
                        yield key, fields
                    if k in seen:
                        raise ShardError(f"{path}: member {ti.name!r}: key {k!r} appears again after other keys"
                                         " (members of a sample must be adjacent)")
                    seen.add(k)
                    key, fields = k, {}
                if suffix in fields:
                    raise ShardError(f"{path}: duplicate member {ti.name!r}")
                fields[suffix] = tar.extractfile(ti).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ShardError(f"{path}: unreadable tar near member {member!r}: {e}") from e
    if key is not None:
        yield key, fields


def decode_sample(path: str, key: str, fields: dict[str, bytes]) -> dict:
    """Decode raw fields into ``{"__key__": key, field: value, ...}``.

    Raises:
        ShardError: a member fails to decode (message names shard and member).
    """
    sample = {"__key__": key}
    for suffix, data in fields.items():
        try:
            field, value = decode_member(suffix, data)
        except Exception as e:  # noqa: BLE001 - any decoder failure is reported with its location
            raise ShardError(f"{path}: cannot decode member {key}.{suffix}: {type(e).__name__}: {e}") from e
        sample[field] = value
    return sample


def iter_samples(path: str, fileobj=None) -> Iterator[dict]:
    """Yield decoded samples of one shard: ``{"__key__": str, "tokens": np.ndarray, "json": dict, ...}``."""
    for key, fields in iter_raw(path, fileobj):
        yield decode_sample(path, key, fields)
