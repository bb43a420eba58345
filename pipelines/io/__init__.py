"""Pipeline input and output: reading files in splits, encoded frames, and the output folder's lifecycle."""
