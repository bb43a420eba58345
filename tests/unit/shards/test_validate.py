"""`python -m shards verify`: one test per fault class, strict and lenient; messages name shard and member."""
from __future__ import annotations

import io
import os
import shutil
import tarfile

import numpy as np
import pytest

from shards import Manifest, ShardError, ShardSequenceWriter, encode_text_sample, iter_samples
from shards.tools.cli import main
from shards.tools.validate import check_shard


def fields(i: int) -> dict[str, bytes]:
    return encode_text_sample(np.arange(i + 1, dtype=np.uint16), {"id": i})


@pytest.fixture()
def dataset(tmp_path):
    d = tmp_path / "ds"
    w = ShardSequenceWriter(str(d), max_samples=4)
    for i in range(8):
        w.write(f"k{i}", fields(i), tokens=i + 1)
    Manifest(shards=w.close()).save(str(d))
    return d


def hand_made(path, members: list[tuple[str, bytes]]) -> str:
    """A tar written by tarfile directly, member by member (for faults our writer refuses to make)."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return str(path)


def verify(capsys, *args) -> tuple[int, str]:
    rc = main(["verify", "-q", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_clean_dataset_passes(dataset, capsys):
    rc, out = verify(capsys, dataset)
    assert rc == 0 and "2 ok, 0 failed; 8 samples, 36 tokens" in out


def test_duplicate_member(tmp_path, capsys):
    f = fields(0)
    path = hand_made(tmp_path / "dup.tar", [("a.json", f["json"]), ("a.json", f["json"]),
                                            ("a.tokens.npy.zst", f["tokens.npy.zst"]), ("b.json", f["json"])])
    rc, out = verify(capsys, path)
    assert rc == 1 and "dup.tar: duplicate member 'a.json'" in out and "duplicate_member" in out
    rc, out = verify(capsys, "--lenient", path)
    assert rc == 0 and "WARN" in out and "; 1 sample, " in out  # 'a' skipped and counted, 'b' kept


def test_non_adjacent_members(tmp_path, capsys):
    f = fields(0)
    path = hand_made(tmp_path / "split.tar", [("a.json", f["json"]), ("b.json", f["json"]),
                                              ("a.tokens.npy.zst", f["tokens.npy.zst"])])
    rc, out = verify(capsys, path)
    assert rc == 1 and "split.tar: member 'a.tokens.npy.zst': key 'a' appears again" in out
    with pytest.raises(ShardError) as e:
        check_shard(path)
    assert e.value.kind == "non_adjacent"


def test_missing_required_field(tmp_path, capsys):
    f = fields(0)
    path = hand_made(tmp_path / "miss.tar", [("a.json", f["json"]), ("a.tokens.npy.zst", f["tokens.npy.zst"]),
                                             ("b.json", f["json"])])
    rc, out = verify(capsys, "--schema", "text", path)
    assert rc == 1 and "miss.tar: sample 'b' has no member b.tokens.*" in out and "missing_field" in out
    rc, out = verify(capsys, "--schema", "text", "--lenient", path)
    assert rc == 0 and "; 1 sample, " in out


def test_missing_field_with_manifest_schema(dataset, capsys):
    """A manifest that lists tokens makes 'text' the required schema."""
    src = dataset / "shard-000000.tar"
    f = fields(0)
    hand_made(src, [("k0.json", f["json"])])
    m = Manifest.load(str(dataset))
    data = src.read_bytes()
    import hashlib
    m.shards[0] = type(m.shards[0])(m.shards[0].name, 1, 0, len(data), hashlib.sha256(data).hexdigest())
    m.save(str(dataset))
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "shard-000000.tar: sample 'k0' has no member k0.tokens.*" in out


@pytest.mark.parametrize("cut", [8192, 8192 + 700, 600, 1200, 0])
def test_truncated_tar(dataset, capsys, cut):
    """Cut at a member boundary, inside the end marker, inside member data, inside a header, to nothing."""
    path = dataset / "shard-000001.tar"  # 8 members of 1024 bytes, then the end-of-archive marker
    path.write_bytes(path.read_bytes()[:cut])
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "truncated" in out and "shard-000001.tar" in out and "member '" in out
    rc, _ = verify(capsys, "--lenient", dataset)
    assert rc == 1  # a truncated file never passes
    stats_rc = main(["stats", str(dataset)])
    assert stats_rc == 0  # readers keep going over the good samples


def test_corrupt_header_mid_file(dataset, capsys):
    path = dataset / "shard-000000.tar"
    data = bytearray(path.read_bytes())
    data[2048 + 10] ^= 0xFF  # inside the third member's header: tarfile would stop silently there
    path.write_bytes(bytes(data))
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "shard-000000.tar: corrupt tar header at byte 2048 after member 'k0.tokens.npy.zst'" in out


def test_size_mismatch(dataset, capsys):
    path = dataset / "shard-000000.tar"
    path.write_bytes(path.read_bytes() + bytes(10240))  # still a valid tar, but not the manifest's file
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "shard-000000.tar: whole file: 20480 bytes, manifest says 10240" in out
    rc, _ = verify(capsys, "--no-checksums", dataset)
    assert rc == 0


def test_checksum_mismatch(dataset, capsys):
    path = dataset / "shard-000001.tar"
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tar:
        first = tar.getmembers()[0]
    data[first.offset_data + first.size] = 1  # tar padding: every reader still accepts the file
    path.write_bytes(bytes(data))
    assert len(list(iter_samples(str(path)))) == 4
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "shard-000001.tar: whole file: sha256" in out and "checksum_mismatch" in out
    rc, _ = verify(capsys, "--lenient", dataset)
    assert rc == 1


def test_missing_shard_and_count_mismatch(dataset, capsys):
    shutil.copy(dataset / "shard-000000.tar", dataset / "copy.tar")
    os.remove(dataset / "shard-000001.tar")
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "shard-000001.tar: shard file is missing" in out
    m = Manifest.load(str(dataset))
    m.shards[0] = type(m.shards[0])(m.shards[0].name, 5, m.shards[0].tokens, m.shards[0].bytes, m.shards[0].sha256)
    m.save(str(dataset))
    rc, out = verify(capsys, dataset / "shard-000000.tar")
    assert rc == 1 and "4 samples read, manifest says 5" in out


def test_token_ids_beyond_the_vocabulary_and_unlisted_tars_fail(dataset, capsys):
    """Issue 37: ids at or above the manifest's vocab_size, and a tar the manifest does not list, passed."""
    m = Manifest.load(str(dataset))
    m.vocab_size = 8  # the shards hold ids 0..7: all inside
    m.save(str(dataset))
    assert verify(capsys, dataset)[0] == 0
    m.vocab_size = 6
    m.save(str(dataset))
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "token_out_of_range 2" in out and "'k7': token id 7 is outside the vocabulary of 6" in out
    m.vocab_size = 8
    m.save(str(dataset))
    shutil.copy(dataset / "shard-000000.tar", dataset / "stray-000000.tar")
    rc, out = verify(capsys, dataset)
    assert rc == 1 and "stray-000000.tar: not listed in" in out and "unlisted_shard 1" in out


def test_a_tokenizer_with_unused_ids_reports_a_vocabulary_holding_every_id():
    """Issue 37: an HF vocabulary with gaps reported its token count (3) as vocab_size while encoding
    ids up to 5, so the shards held ids beyond the manifest's vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipelines.config import TokenizerConfig
    from pipelines.records import Doc
    from pipelines.stages.tokenize import TokenizeFn
    from shards.tokenizers import TokenizerFile, build

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1, "b": 5}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    file = TokenizerFile("hf", "tokenizer.json", tok.to_str().encode())
    assert build(file).vocab_size == 6
    fn = TokenizeFn(TokenizerConfig(add_eos=False))
    fn.setup()
    fn.start_bundle()
    (batch,) = fn.process([Doc("d", "a b c", "s")], file)
    assert batch[0].tokens.tolist() == [0, 5, 1]
