"""Decoding for encoder-decoder models: batched greedy search (beam search lives beside it)."""

from __future__ import annotations

import torch

from tfcli.model.config import BOS_ID, EOS_ID, PAD_ID


@torch.inference_mode()
def greedy_search(model, src: torch.Tensor, max_len_a: float = 1.2, max_len_b: int = 10) -> list[list[int]]:
    """Greedy decoding with the KV cache; the encoder runs once per batch.

    src: (B, S) padded source ids (with </s>). Each output is cut at </s> (not included), at most a*src_len+b tokens.
    Finished sentences leave the batch, so no compute is spent on them.
    """
    B = src.size(0)
    src_len = (src != PAD_ID).sum(1)
    max_len = (src_len.float() * max_len_a + max_len_b).long()
    memory, mem_mask = model.encode(src)
    cache = model.new_cache()
    alive = torch.arange(B, device=src.device)  # which original rows are still decoding
    out: list[list[int]] = [[] for _ in range(B)]
    tok = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)
    step = 0
    while alive.numel():
        logits = model.decode(tok, memory, mem_mask, cache)[:, -1]
        nxt = logits.argmax(-1)
        step += 1
        done = (nxt == EOS_ID) | (step >= max_len[alive])
        for row, t, d in zip(alive.tolist(), nxt.tolist(), done.tolist()):
            if t != EOS_ID:
                out[row].append(t)
        keep = (~done).nonzero().flatten()
        if keep.numel() < alive.numel():
            alive, memory, mem_mask = alive[keep], memory[keep], mem_mask[keep]
            cache.select(keep)
            nxt = nxt[keep]
        tok = nxt.unsqueeze(1)
    return out
