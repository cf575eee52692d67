"""Validation during training: the loss over the whole valid split, and greedy-search BLEU on (part of) it."""

from __future__ import annotations

import torch

from tfcli.data.batching import pad, source_ids, token_batches
from tfcli import distributed
from tfcli.train.log import ppl
from tfcli.train.loss import batch_loss


@torch.inference_mode()
def valid_loss(objective, data, dist, device, autocast, even: bool = False) -> dict:
    """loss (label-smoothed), nll and ppl per target token over the whole split, sharded over the processes.
    `even`: every process runs as many batches (an FSDP model's forward is a collective), the short ones a batch
    again whose sums they leave out."""
    sums = [0.0, 0.0, 0.0]
    batches = data.batches(0, shuffle=False)
    mine = [(b, True) for b in distributed.shard(batches, dist)]
    if even and batches:
        mine += [(batches[0], False)] * (-(-len(batches) // dist.world_size) - len(mine))
    for b, counted in mine:
        batch = data.collate(b).to(device)
        with autocast():
            loss, nll = batch_loss(objective, batch)
        if counted:
            sums = [sums[0] + loss.item(), sums[1] + nll.item(), sums[2] + batch.tgt_tokens]
    loss, nll, tokens = distributed.all_reduce_sum(sums, dist, device)
    return {"loss": loss / tokens, "nll": nll / tokens, "ppl": ppl(nll / tokens)}


@torch.inference_mode()
def greedy_bleu(model, data, prepared, split: str, n: int, max_tokens: int, max_sentences: int, max_len: int,
                device, autocast, pack: bool = False) -> float:
    """Greedy-decode the first `n` valid sources as `tfcli translate --greedy` would (its length rule, and in fp32
    the same packed step: the same kernels, so the same tokens); sacreBLEU (default signature) against the cleaned
    references (or, where prepare kept no text, the detokenised reference ids). `pack`: fp32 weights (no
    autocast), packed as translate packs them."""
    import sacrebleu
    from tokenizers import Tokenizer

    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.search import Rows, SearchOptions, greedy_decode
    from tfcli.generate.step import StepModel
    from tfcli.io import read_lines

    hyps: list[list[int]] = [[] for _ in range(n)]
    steps = StepModel(model, pack=pack)  # its key/value memory is reused from batch to batch, and dropped after
    options = SearchOptions.from_config(TranslateConfig(beam_size=1))  # (`translate --greedy`'s)
    prompted = data.kind == "lm"  # (a decoder-only translator: its prompts, PairData's)
    for idx in token_batches(data.src_len[:n], max_tokens, max_sentences or None):
        if prompted:
            prompts = [data.prompt(data.src[i]) for i in idx]
            src = pad(prompts).to(device)
            rows = Rows.build(device, max_len, sources=[len(p) - 2 for p in prompts])
        else:
            src, rows = pad([source_ids(data.src[i], max_len) for i in idx]).to(device), Rows()
        with autocast():
            for i, out in zip(idx, greedy_decode(steps, src, options, rows)):
                hyps[i] = out.tokens
    tok = Tokenizer.from_file(str(prepared.tokenizer_file("tgt")))
    hyp_text = tok.decode_batch(hyps, skip_special_tokens=True)
    ref_file = prepared.text_file(split, "tgt")
    refs = read_lines(ref_file) if ref_file is not None else []
    if len(refs) != len(data):  # no cleaned text kept: detokenise the reference ids instead
        refs = tok.decode_batch([data.tgt[i].tolist() for i in range(n)], skip_special_tokens=True)
    return sacrebleu.corpus_bleu(hyp_text, [refs[:n]]).score
