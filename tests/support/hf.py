"""Hugging Face Llama models for tests, built from configs with random weights (no downloads)."""
from __future__ import annotations

import sys

import torch


def relink_logs() -> None:
    """Point transformers' log handler at the live ``sys.stderr``. It keeps the stream (and that
    stream's ``flush``) of the moment it was made; when that was a ``capsys`` stream of an earlier
    test (closed since), each later transformers warning prints ``--- Logging error ---`` and a
    traceback into whatever test runs then. A no-op until transformers' logging is imported."""
    hf_logging = sys.modules.get("transformers.utils.logging")
    handler = getattr(hf_logging, "_default_handler", None)
    if handler is not None:  # not setStream(): it flushes the old stream, which may be closed
        handler.stream, handler.flush = sys.stderr, sys.stderr.flush


def save_random_llama(folder: str, vocab: int = 96, kv_heads: int = 2, tie: bool = True, seed: int = 0,
                      **config):
    """Save a randomly initialised ``LlamaForCausalLM`` (hidden 32, 2 layers, 4 heads, SwiGLU width 88,
    RoPE base 500000) with ``save_pretrained`` into ``folder``; returns the model (fp32, eval mode).
    ``config``: further ``LlamaConfig`` fields."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 88, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": kv_heads, "max_position_embeddings": 64,
                         "rms_norm_eps": 1e-5, "tie_word_embeddings": tie,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, **config})
    from trainer.export.hf import quiet
    model = LlamaForCausalLM(cfg).eval()
    with quiet():
        model.save_pretrained(folder)
    return model


def save_tiny_text_classifier(folder: str, texts: list[str], labels: list[str], steps: int = 30, seed: int = 0):
    """Train a tiny ``BertForSequenceClassification`` (hidden 16, 1 layer) with a word-level
    tokenizer built here from ``texts`` (``tokenizers``; lower-cased words, no downloads) to tell
    ``labels`` apart, and save both with ``save_pretrained`` into ``folder``.

    Args:
        folder: where the model folder is written.
        texts: training texts.
        labels: each text's label name; the model's labels are these names, sorted.
        steps: full-batch Adam steps.
        seed: torch's seed (weights and training are deterministic on the CPU).
    Returns:
        the model's label names, by id.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    words = sorted({w for t in texts for w in t.lower().replace("!", " ! ").replace(".", " . ").split()})
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                        sep_token="[SEP]", model_max_length=64)
    names = sorted(set(labels))
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)}))
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    target = torch.tensor([names.index(label) for label in labels])
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        optim.zero_grad()
        model(**batch, labels=target).loss.backward()
        optim.step()
    model.eval()
    from trainer.export.hf import quiet
    with quiet():
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return names
