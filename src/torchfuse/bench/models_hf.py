"""GPU model cases built from transformers configs: decoder LMs, an encoder, an encoder-decoder.

Every model comes from a config written here, with seeded random weights: nothing is downloaded
(no ``from_pretrained``, no tokenizer). Dropout is zero in every config, so that eager and the
compilers compute the same function. Training steps pass ``labels`` as an input of the compiled
module, so the loss (shift, ignore_index, cross-entropy in float32) is traced inside the model's
graph, as in a user's training loop. Training steps are judged against a float64 step
(``models_common.checked_training``), inference against a float64 forward where it is cheap.

``quick`` builds a tiny config of the same architecture at batch 2 (tests run it on a CPU);
the full size is meant to take 5-50 ms a step on an H200.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchfuse.bench.cases import Workload, inference_workload
from torchfuse.bench.models_common import checked_training

VOCAB = 32000


class LossInside(nn.Module):
    """``model(input_ids=ids, labels=labels).loss``: the tensors are inputs of the compiled
    module (not constants baked into its graph), and the loss is computed by the model itself."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def _ids(shape: tuple[int, ...], vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _labels(ids: torch.Tensor, vocab: int, ignored: float = 0.1) -> torch.Tensor:
    """Random targets with about ``ignored`` of them -100, so the loss's ignore_index path runs."""
    gen = torch.Generator().manual_seed(7)
    labels = torch.randint(0, vocab, ids.shape, generator=gen)
    return torch.where(torch.rand(ids.shape, generator=gen) < ignored, -100, labels)


def _lm_sizes(quick: bool, full: dict[str, Any]) -> dict[str, Any]:
    """A decoder LM config's sizes: ``full`` on a GPU, a tiny one with the same GQA ratio for tests."""
    if not quick:
        return full
    ratio = full["num_attention_heads"] // full["num_key_value_heads"]
    return dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4 // ratio, vocab_size=512, max_position_embeddings=256)


def _gqa_note(cfg: Any, batch: int, seq: int) -> str:
    return (f"{cfg.num_hidden_layers} layers, dim {cfg.hidden_size}, {cfg.num_attention_heads} heads / "
            f"{cfg.num_key_value_heads} KV heads, vocab {cfg.vocab_size}, {batch}x{seq} tokens")


# -- decoder LMs: RoPE, grouped-query attention, RMSNorm, SwiGLU -----------------------------------
def llama_hf_infer(device: torch.device, quick: bool) -> Workload:
    """transformers' LlamaForCausalLM forward in bf16: logits of every position, no KV cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = _lm_sizes(quick, dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                                  num_attention_heads=16, num_key_value_heads=4, vocab_size=VOCAB,
                                  max_position_embeddings=2048))
    cfg = LlamaConfig(**sizes, attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
    batch, seq = (2, 64) if quick else (8, 512)
    ids = _ids((batch, seq), cfg.vocab_size, 0).to(device)
    return inference_workload(model, (ids,), torch.bfloat16, f"Llama (HF), {_gqa_note(cfg, batch, seq)}, bf16")


def mistral_train(device: torch.device, quick: bool) -> Workload:
    """transformers' MistralForCausalLM training step in bf16 weights, the loss inside the model.

    The sliding window is shorter than the sequence, so attention takes Mistral's banded causal
    mask rather than plain causal attention; a tenth of the labels are ignored (-100).
    """
    from transformers import MistralConfig, MistralForCausalLM

    sizes = _lm_sizes(quick, dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=6,
                                  num_attention_heads=16, num_key_value_heads=4, vocab_size=VOCAB,
                                  max_position_embeddings=4096))
    batch, seq = (2, 64) if quick else (8, 512)
    cfg = MistralConfig(**sizes, sliding_window=seq // 2, attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).train()
    ids = _ids((batch, seq), cfg.vocab_size, 0)
    labels = _labels(ids, cfg.vocab_size)
    return checked_training(LossInside(model), (ids.to(device), labels.to(device)), lambda loss: loss,
                            torch.bfloat16, f"Mistral (HF), {_gqa_note(cfg, batch, seq)}, window {seq // 2}, "
                            "bf16 weights, loss in the model, fwd+bwd")


def gpt2_infer(device: torch.device, quick: bool) -> Workload:
    """GPT-2 small forward in bf16 (learned positions, LayerNorm, GELU, a 50257-wide LM head)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2 if quick else 12, n_embd=768, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device=device, dtype=torch.bfloat16).eval()
    batch, seq = (2, 64) if quick else (8, 512)
    ids = _ids((batch, seq), cfg.vocab_size, 0).to(device)
    return inference_workload(model, (ids,), torch.bfloat16, f"GPT-2 small, {batch}x{seq} tokens, bf16",
                              reference=False)


# -- encoder and encoder-decoder -------------------------------------------------------------------
def distilbert_infer(device: torch.device, quick: bool) -> Workload:
    """transformers' DistilBertModel in bf16 with a padding mask (rows of different lengths):
    the hidden states of every position, padded ones included."""
    from transformers import DistilBertConfig, DistilBertModel

    layers, dim, heads = (2, 64, 4) if quick else (6, 768, 12)
    cfg = DistilBertConfig(n_layers=layers, dim=dim, n_heads=heads, hidden_dim=4 * dim,
                           vocab_size=512 if quick else 30522, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = DistilBertModel(cfg).to(device=device, dtype=torch.bfloat16).eval()
    batch, seq = (2, 64) if quick else (32, 512)
    ids = _ids((batch, seq), cfg.vocab_size, 0)
    lengths = torch.linspace(seq // 2, seq, batch).long()  # the last row is unpadded
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return inference_workload(model, (ids.to(device), mask.to(device)), torch.bfloat16,
                              f"DistilBERT, {layers} layers, dim {dim}, {batch}x{seq} tokens with padding, bf16")


def t5_train(device: torch.device, quick: bool) -> Workload:
    """transformers' T5ForConditionalGeneration (v1.1 style: gated GELU, no output scaling)
    training step under bf16 autocast; labels make the decoder inputs (shifted right) and the loss.
    Relative position buckets (log of distances) and T5's RMS-style layer norm are in the graph."""
    from transformers import T5Config, T5ForConditionalGeneration

    if quick:
        sizes = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=512)
    else:
        sizes = dict(d_model=512, d_kv=64, d_ff=1024, num_layers=6, num_decoder_layers=6, num_heads=8, vocab_size=32128)
    cfg = T5Config(**sizes, feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
                   decoder_start_token_id=0, pad_token_id=0, use_cache=False)
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(cfg).to(device).train()
    batch, enc, dec = (2, 64, 16) if quick else (16, 512, 128)
    ids = _ids((batch, enc), cfg.vocab_size, 0)
    labels = _labels(_ids((batch, dec), cfg.vocab_size, 1), cfg.vocab_size)
    return checked_training(LossInside(model), (ids.to(device), labels.to(device)), lambda loss: loss,
                            torch.float32, f"T5 v1.1, {cfg.num_layers}+{cfg.num_decoder_layers} layers, dim "
                            f"{cfg.d_model}, {batch}x{enc} -> {dec} tokens, autocast bf16, loss in the model, "
                            "fwd+bwd", autocast=torch.bfloat16)


def bert_mlm_train(device: torch.device, quick: bool) -> Workload:
    """BERT-base masked-LM training step under bf16 autocast; 15% of positions carry a label."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(num_hidden_layers=2 if quick else 12, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).to(device).train()
    batch, seq = (2, 64) if quick else (16, 512)
    ids = _ids((batch, seq), cfg.vocab_size, 0)
    labels = _labels(ids, cfg.vocab_size, ignored=0.85)
    return checked_training(LossInside(model), (ids.to(device), labels.to(device)), lambda loss: loss,
                            torch.float32, f"BERT-base MLM, {batch}x{seq} tokens, autocast bf16, fwd+bwd",
                            autocast=torch.bfloat16)
