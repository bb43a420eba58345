"""Tokenizers: one contract (``contract.Tokenizer``), three kinds (sentencepiece, Hugging Face
``tokenizer.json``, tiktoken), and the registry that reads, builds and saves them (``registry``)."""
from shards.tokenizers.contract import SpecialIds, Tokenizer, TokenizerError, TokenizerFile
from shards.tokenizers.registry import (
           AUTO,
           FOLDER_FILE_NAMES,
           KINDS,
           auto_files_of_shards,
           build,
           folder_files,
           from_folder_files,
           of_shards,
           read,
)

__all__ = ["AUTO", "FOLDER_FILE_NAMES", "KINDS", "SpecialIds", "auto_files_of_shards", "Tokenizer", "TokenizerError", "TokenizerFile", "build", "folder_files",
           "from_folder_files", "of_shards", "read"]
