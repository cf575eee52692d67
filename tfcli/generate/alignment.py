"""Word alignments from the cross-attention (fairseq `--print-alignment`, Marian `--alignment hard`).

For each output token y_t, the source token that the chosen decoder layer's cross-attention (heads averaged) weighs
most, in a teacher-forced pass over the source and the finished hypothesis; the source's </s> and padding are
never chosen. Tokens are then mapped to words: source words are the input line's whitespace-separated words, target
words the output text's (with `raw`, the printed subword tokens on both sides), and a pair of words is aligned when
any of their tokens are. Written in Pharaoh format, `i-j` for source word i and target word j (0-based), in target
order. The default layer is the penultimate: its attention aligns best in a standard Transformer (Garg et al.
2019, "Jointly Learning to Align and Translate with Transformer Models").
"""

from __future__ import annotations

import torch

from tfcli.data.batching import pad
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID


def default_layer(n_layers: int) -> int:
    """The 1-based decoder layer whose cross-attention aligns: the penultimate (the only one of a 1-layer decoder)."""
    return max(n_layers - 1, 1)


@torch.inference_mode()
def token_alignments(model, src: torch.Tensor, hyps: list[list[int]], layer: int) -> list[list[int]]:
    """For each hypothesis (its tokens, without </s>) of the source row of the same index in `src` (B, S): the
    source position each of its tokens is aligned to."""
    if not any(hyps):
        return [[] for _ in hyps]
    tgt_in = pad([[BOS_ID] + h for h in hyps]).to(src.device)  # query t predicts hypothesis token t
    attn: dict[str, list[torch.Tensor]] = {"encoder": [], "self": [], "cross": []}
    memory, mem_mask = model.encode(src, attn_out=attn)
    model.decode(tgt_in, memory, mem_mask, attn_out=attn)
    weights = attn["cross"][layer - 1].float().mean(1)  # (B, T, S), heads averaged
    weights = weights.masked_fill(((src == PAD_ID) | (src == EOS_ID))[:, None, :], float("-inf"))
    best = weights.argmax(-1).tolist()
    return [row[: len(h)] for row, h in zip(best, hyps)]


def word_of_token(tok, ids: list[int], raw: bool) -> list[int]:
    """The 0-based word each token of `ids` belongs to, the words being the whitespace-separated words of the
    decoded text (with `raw`: each token is a word). A token that starts no new word belongs to the word before."""
    if raw:
        return list(range(len(ids)))
    words, out = 0, []
    for i in range(len(ids)):
        words = max(len(tok.decode(ids[: i + 1], skip_special_tokens=False).split()), 1)
        out.append(words - 1)
    return out


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """`i-j` for each (source word, target word), once each, in target order."""
    return " ".join(f"{i}-{j}" for i, j in word_pairs(pairs))


def word_pairs(pairs) -> list[tuple[int, int]]:
    """(source word, target word) pairs, once each, in target order."""
    return sorted(set(pairs), key=lambda p: (p[1], p[0]))


def word_alignment(src_tok, tgt_tok, src_ids: list[int], hyp: list[int], aligned: list[int],
                   raw: bool, lead: int = 0) -> list[tuple[int, int]]:
    """The word pairs from `aligned` (the source position of each token of `hyp`), in target order. `lead`: tokens
    in front of the line's own (a multilingual model's language tag), part of no word."""
    src = [t for t in src_ids if t not in (EOS_ID, PAD_ID)][lead:]
    src_words = word_of_token(src_tok, src, raw)
    tgt_words = word_of_token(tgt_tok, hyp, raw)
    return word_pairs((src_words[s - lead], tgt_words[t]) for t, s in enumerate(aligned)
                      if lead <= s < lead + len(src_words))
