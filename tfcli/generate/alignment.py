"""Word alignments from the cross-attention (fairseq `--print-alignment`, Marian `--alignment hard`), or a
decoder-only model's self-attention onto the source in its prompt (`prompt_alignments`).

For each output token y_t, the source token that the chosen decoder layer's cross-attention (heads averaged) weighs
most, in a teacher-forced pass over the finished hypothesis that runs the decoder only up to that layer's attention,
on the encoder output the search decoded from; the source's </s> and padding are never chosen. Tokens are then mapped to words: source words are the input line's whitespace-separated words, target
words the output text's (with `raw`, the printed subword tokens on both sides), and a pair of words is aligned when
any of their tokens are. Written in Pharaoh format, `i-j` for source word i and target word j (0-based), in target
order. The default layer is the penultimate: its attention aligns best in a standard Transformer (Garg et al.
2019, "Jointly Learning to Align and Translate with Transformer Models").
"""

from __future__ import annotations

import torch

from tfcli.data.batching import pad
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID


CHUNK = 16  # hypotheses a teacher-forced pass takes at once, sorted by length


def default_layer(n_layers: int) -> int:
    """The 1-based decoder layer whose cross-attention aligns: the penultimate (the only one of a 1-layer decoder)."""
    return max(n_layers - 1, 1)


@torch.inference_mode()
def token_alignments(model, src: torch.Tensor, hyps: list[list[int]], layer: int, encode=None) -> list[list[int]]:
    """For each hypothesis (its tokens, without </s>) of the source row of the same index in `src` (B, S): the
    source position each of its tokens is aligned to. `encode`: src -> (memory, mask), the encoder output the search
    decoded from (`Remembered.recall`; the model's own `encode` by default), called once for the distinct rows. Only the decoder layers up to the aligning one
    run, and of that one only its attention."""
    if not any(hyps):
        return [[] for _ in hyps]
    rows, index = torch.unique(src, dim=0, return_inverse=True)
    memory, mem_mask = (encode or model.encode)(rows)
    out: list[list[int]] = [[] for _ in hyps]
    order = sorted(range(len(hyps)), key=lambda i: len(hyps[i]))  # similar lengths together: little padding
    for at in range(0, len(order), CHUNK):
        part = [i for i in order[at : at + CHUNK] if hyps[i]]
        if not part:
            continue
        tgt_in = pad([[BOS_ID] + hyps[i] for i in part]).to(src.device)  # query t predicts hypothesis token t
        take = index[torch.tensor(part, device=index.device)]
        weights = model.decoder.cross_weights(tgt_in, memory[take], mem_mask[take], layer).mean(1)  # heads averaged
        weights = weights.masked_fill(((rows[take] == PAD_ID) | (rows[take] == EOS_ID))[:, None, :], float("-inf"))
        for i, best in zip(part, weights.argmax(-1).tolist()):
            out[i] = best[: len(hyps[i])]
    return out


@torch.inference_mode()
def prompt_alignments(model, prompts: list[list[int]], spans: list[tuple[int, int]], hyps: list[list[int]],
                      layer: int) -> list[list[int]]:
    """A decoder-only model's `token_alignments`: for each hypothesis (its tokens, without </s>) of the prompt of
    the same index, the position in that prompt's source span (start, end), counted from its start, that the
    self-attention of `layer` (heads averaged) weighs most from the position that predicts the token (the prompt's
    last for the first), in one teacher-forced pass over prompt and hypothesis (a prefix LM's prompt its prefix)."""
    out: list[list[int]] = [[] for _ in hyps]
    order = sorted(range(len(hyps)), key=lambda i: len(prompts[i]) + len(hyps[i]))
    device = next(model.parameters()).device
    for at in range(0, len(order), CHUNK):
        part = [i for i in order[at : at + CHUNK] if hyps[i]]
        if not part:
            continue
        ids = pad([prompts[i] + hyps[i][:-1] for i in part]).to(device)  # (right-padded: nothing real sees it)
        prefix = torch.tensor([len(prompts[i]) for i in part], device=device)
        weights = model.decoder.self_weights(ids, layer, prefix if model.cfg.prefix_attention else None).mean(1)
        for row, i in enumerate(part):
            P, (a, b) = len(prompts[i]), spans[i]
            out[i] = weights[row, P - 1 : P - 1 + len(hyps[i]), a:b].argmax(-1).tolist()
    return out


class Remembered:
    """A StepModel that keeps the encoder outputs the search computes, so that the alignment pass reads each
    source row's instead of encoding it again (`recall`). Everything else is the StepModel's own."""

    def __init__(self, sm):
        self.sm, self.kept = sm, []

    def __getattr__(self, name):
        return getattr(self.sm, name)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        memory, mask = self.sm.encode(src)
        self.kept.append((src, memory, mask))
        return memory, mask

    def recall(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder output and mask of the rows `src`, as `encode` gave them (found by their ids, on the device:
        no wait for it); rows it never saw are encoded now."""
        seen = [k for k in self.kept if k[0].size(1) == src.size(1)]
        if not seen:
            return self.sm.encode(src)
        ids, memory, mask = (torch.cat(t) for t in zip(*seen))
        same = (src[:, None, :] == ids[None, :, :]).all(-1)  # (B, kept)
        if not bool(same.any(1).all()):
            return self.sm.encode(src)
        at = same.float().argmax(1)
        return memory[at], mask[at]


def word_of_token(tok, ids: list[int], raw: bool) -> list[int]:
    """The 0-based word each token of `ids` belongs to, the words being the whitespace-separated words of the
    decoded text (with `raw`: each token is a word). A token that starts no new word belongs to the word before."""
    if raw:
        return list(range(len(ids)))
    replacement = _metaspace(tok)
    if replacement is not None:  # decoding only turns the replacement into spaces: the pieces, counted in one pass
        out, words, space = [], 0, True
        for piece in (tok.id_to_token(i) or "" for i in ids):
            text = piece.replace(replacement, " ")
            if text:  # (its first word continues the one before when neither side has a space)
                words += len(text.split()) - (not space and not text[0].isspace())
                space = text[-1].isspace()
            out.append(max(words, 1) - 1)
        return out
    prefixes = [ids[: i + 1] for i in range(len(ids))]  # (any decoder: the words of each prefix's decoding)
    if hasattr(tok, "decode_batch"):
        texts = tok.decode_batch(prefixes, skip_special_tokens=False)
    else:
        texts = [tok.decode(p, skip_special_tokens=False) for p in prefixes]
    return [max(len(t.split()), 1) - 1 for t in texts]


def _metaspace(tok) -> str | None:
    """The replacement character of a tokenizer whose decoder is a plain Metaspace (SentencePiece's), else None."""
    from tokenizers import decoders

    decoder = getattr(tok, "decoder", None)
    return decoder.replacement if isinstance(decoder, decoders.Metaspace) else None


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """`i-j` for each (source word, target word), once each, in target order."""
    return " ".join(f"{i}-{j}" for i, j in word_pairs(pairs))


def word_pairs(pairs) -> list[tuple[int, int]]:
    """(source word, target word) pairs, once each, in target order."""
    return sorted(set(pairs), key=lambda p: (p[1], p[0]))


def word_alignment(src_tok, tgt_tok, src_ids: list[int], hyp: list[int], aligned: list[int],
                   raw: bool, lead: int = 0, plain: bool = False) -> list[tuple[int, int]]:
    """The word pairs from `aligned` (the source position of each token of `hyp`), in target order. `lead`: tokens
    in front of the line's own (a multilingual model's language tag), part of no word; `plain`: `src_ids` are the
    source's tokens only (a prompt's span, in a vocabulary whose ids 0 and 2 may be words), else </s> and padding
    are dropped."""
    src = src_ids[lead:] if plain else [t for t in src_ids if t not in (EOS_ID, PAD_ID)][lead:]
    src_words = word_of_token(src_tok, src, raw)
    tgt_words = word_of_token(tgt_tok, hyp, raw)
    return word_pairs((src_words[s - lead], tgt_words[t]) for t, s in enumerate(aligned)
                      if lead <= s < lead + len(src_words))
