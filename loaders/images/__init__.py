"""The image path: DALI pipelines over image shards and their checked indexes."""
