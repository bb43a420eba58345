"""Reading documents through the node cache: one shard reader over the layout's handles (numpy only)."""
