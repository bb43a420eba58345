"""The loader of one rank: the torch side (TokenBatch, the loader, equal step counts)."""
