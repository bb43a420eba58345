"""The shard format: sample keys, member encoding, token blocks, the manifest and the layout registry."""
