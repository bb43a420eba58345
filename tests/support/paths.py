"""Where the repository is, for tests that run its files and command lines."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
