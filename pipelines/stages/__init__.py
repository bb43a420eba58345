"""The pipeline's stages, one module each, the Beam transform beside its logic."""
