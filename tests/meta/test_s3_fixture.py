"""The local S3 API fixture round-trips bytes through s3fs (what the s3:// tests rely on)."""
import s3fs


def test_s3_server_round_trip(s3_server):
    _, opts = s3_server
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("fixture-bucket")
    fs.pipe("fixture-bucket/a/b.bin", b"\x00\x01colaflow")
    assert fs.cat("fixture-bucket/a/b.bin") == b"\x00\x01colaflow"
    assert fs.ls("fixture-bucket/a") == ["fixture-bucket/a/b.bin"]
