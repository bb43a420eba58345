"""The cache's storage: the on-disk store and its accounting, node-wide locks, downloads and prefetch."""
