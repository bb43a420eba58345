"""One consumer's read loop and the worker processes that run it (numpy only: never imports torch)."""
