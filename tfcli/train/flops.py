"""Model FLOPs of a training step, for model-FLOPs utilisation (MFU).

As in PaLM (Chowdhery et al. 2022, appendix B) and nanoGPT: a matrix multiply with an N-parameter weight costs
2N FLOPs per token forward and 4N backward, so 6N for training; attention scores and the weighted sum add
2 * 2 * d_model FLOPs per (query, key) pair per layer forward, times 3 with the backward pass: 12 * d_model per pair.
Only useful work counts: real tokens and real (query, key) pairs, no padding, no recomputation.
"""

from __future__ import annotations

from tfcli.model.config import ModelConfig


def matmul_params(cfg: ModelConfig) -> tuple[int, int]:
    """Weights multiplied per source token and per target token (embedding lookups are not multiplies; the output
    projection is, tied or not)."""
    d, f = cfg.d_model, cfg.d_ff
    d_kv = cfg.kv_heads * cfg.d_head  # grouped-query attention: narrower k and v
    attn = 2 * d * d + 2 * d * d_kv  # q, k, v and output projections
    ffn = (3 if cfg.activation in ("swiglu", "geglu") else 2) * d * f  # a gated FFN has a third matrix
    if cfg.kind == "lm":
        return 0, cfg.n_decoder_layers * (attn + ffn) + d * cfg.tgt_vocab_size
    per_src = cfg.n_encoder_layers * (attn + ffn) + cfg.n_decoder_layers * 2 * d * d_kv  # + cross-attention k, v
    per_tgt = cfg.n_decoder_layers * (attn + 2 * d * d + ffn) + d * cfg.tgt_vocab_size  # + cross q, out
    return per_src, per_tgt


def train_flops(cfg: ModelConfig, src_tokens: int, tgt_tokens: int, src_pairs: int, tgt_pairs: int, cross_pairs: int) -> float:
    """FLOPs of forward + backward over a batch with these token counts and attention (query, key) pair counts,
    each summed over sentences: src_pairs = sum S^2 (encoder self-attention), tgt_pairs = sum T^2 (decoder
    self-attention; causal masking is not discounted, as in PaLM), cross_pairs = sum T*S (cross-attention)."""
    per_src, per_tgt = matmul_params(cfg)
    d = cfg.d_model
    flops = 6.0 * (per_src * src_tokens + per_tgt * tgt_tokens)
    flops += 12.0 * d * (cfg.n_encoder_layers * src_pairs + cfg.n_decoder_layers * (tgt_pairs + cross_pairs))
    return flops


# Dense peak FLOP/s of one GPU, from the vendors' datasheets (without 2:4 sparsity, which halves the quoted figures):
# (a fragment of torch.cuda.get_device_name(), bf16/fp16 tensor cores, TF32 tensor cores). The first fragment found
# in the name wins, so the more specific ones come first ("H100 PCIe" before "H100", "L40S" before "L4").
GPU_PEAKS = (
    ("H100 PCIe", 756e12, 378e12),
    ("H100 NVL", 835e12, 417.5e12),
    ("H200 NVL", 835e12, 417.5e12),
    ("H100", 989.4e12, 494.7e12),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200", 989.4e12, 494.7e12),  # SXM (and GH200)
    ("A100", 312e12, 156e12),
    ("L40S", 362e12, 183e12),
    ("L4", 121e12, 60e12),
)


def gpu_peak_flops(device_name: str, precision: str) -> float | None:
    """The dense peak that MFU divides by, for training in `precision` on the GPU called `device_name`: the bf16/fp16
    tensor-core peak, or the TF32 one for fp32 (the trainer lets fp32 matmuls use TF32). None for a GPU not listed."""
    for fragment, half, tf32 in GPU_PEAKS:
        if fragment in device_name:
            return tf32 if precision == "fp32" else half
    return None
