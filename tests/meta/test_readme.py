"""The configuration shown in README.md loads as the README says it does."""
import os
import re

from cache.config import load_cache_config, parse_size
from tests.support.paths import REPO

ROOT = str(REPO)


def test_readme_cache_section_loads_with_node_override(tmp_path):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", readme, flags=re.S) if b.startswith("cache:"))
    path = tmp_path / "node.yaml"
    path.write_text(block)
    other = load_cache_config(str(path), hostname="login-1", environ={})
    assert other.dir == "/nvme/colaflow" and parse_size(other.max_bytes) == 200 * 2**30
    assert parse_size(other.min_free_bytes) == 20 * 2**30 and other.prefetch_shards == 4
    assert other.verify == "first"
    a100 = load_cache_config(str(path), hostname="gpu-a100-07", environ={})
    assert parse_size(a100.max_bytes) == int(1.5 * 2**40)
    env = load_cache_config(str(path), hostname="gpu-a100-07",
                            environ={"COLAFLOW_CACHE_DIR": "/scratch/cache", "COLAFLOW_CACHE_MAX_BYTES": "50GiB"})
    assert env.dir == "/scratch/cache" and parse_size(env.max_bytes) == 50 * 2**30  # env beats the node entry
