"""Streaming shard I/O: the tar writers, the streaming reader and the shard indexes (DALI, wids)."""
