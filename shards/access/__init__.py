"""Random access into one local shard: member offsets, document tables and one handle per layout (numpy only)."""
