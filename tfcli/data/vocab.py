"""A tokenizer.json's vocabulary put into tfcli's layout: the special tokens at their fixed ids, with tfcli's names.

Torch-free, so that `tfcli prepare --tokenizer-from model.spm` can use it as well as `tfcli import`.
"""

from __future__ import annotations

import json

from tfcli.specials import SPECIAL_TOKENS, UNK_ID


UNUSED_NAME = "<|tfcli unused "  # the start of the name reorder_vocabulary gives a row no token of the model has


def vocab_list(tok: dict) -> list[str]:
    """Tokens in id order (model vocabulary and added tokens)."""
    model = tok["model"]
    if model["type"] == "Unigram":
        tokens = [piece for piece, _ in model["vocab"]]
    else:
        vocab = model["vocab"]
        tokens = [""] * (max(vocab.values()) + 1 if vocab else 0)
        for t, i in vocab.items():
            tokens[i] = t
    for added in tok.get("added_tokens", []):
        while len(tokens) <= added["id"]:
            tokens.append("")
        tokens[added["id"]] = added["content"]
    return tokens


def plain_name(token: str, hf_id: int) -> str:
    """The name an ordinary entry spelled like one of tfcli's special tokens takes (OPUS-MT tc-big's vocabularies
    hold `<s>` as a plain row, which its SentencePiece models never produce from text): its row and scores are kept,
    under a name that no text matches as a special token."""
    return f"{token[:-1]}|{hf_id}>"


def reorder_vocabulary(tok: dict, special: dict[int, int | None], rows: int | None = None,
                       keep_names: bool = False) -> tuple[dict, list[int]]:
    """tfcli's tokenizer.json and `order` (tfcli id -> HF id, -1 for a new row): the specials at tfcli's ids, then
    every other token in HF order. The specials take tfcli's names, or with `keep_names` (a published language
    model, whose prompts and chat templates write them) keep the model's own; a special the model lacks is then a
    vocabulary entry no text produces. `rows`: the model's embedding rows, where more than its tokens (Qwen's): the
    rows past the tokens are kept, as entries no text produces, so the softmax spans the model's own rows."""
    tokens = vocab_list(tok)
    if rows is not None and rows > len(tokens):
        tokens += [""] * (rows - len(tokens))
    taken = set(tokens)
    for i, t in enumerate(tokens):  # (an unused id, or a row past the tokens: a name of its own)
        if t == "":
            tokens[i] = _unused_name(f"{UNUSED_NAME}{i}|>", taken)
    heads = [special[i] if special[i] is not None else -1 for i in range(len(SPECIAL_TOKENS))]
    used = {h for h in heads if h >= 0}
    order = heads + [i for i in range(len(tokens)) if i not in used]
    if order == list(range(len(tokens))) and tokens[: len(SPECIAL_TOKENS)] == SPECIAL_TOKENS:
        return tok, order  # already tfcli's layout (a tfcli export)
    if keep_names:
        heads_named = [tokens[h] if h >= 0 else _unused_name(SPECIAL_TOKENS[i], taken) for i, h in enumerate(heads)]
        new = heads_named + [tokens[h] for h in order[len(SPECIAL_TOKENS):]]
    else:
        new = [SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else tokens[h] for i, h in enumerate(order)]
        for i in range(len(SPECIAL_TOKENS), len(new)):
            if new[i] in SPECIAL_TOKENS:
                new[i] = plain_name(new[i], order[i])
    if len(set(new)) != len(new):  # (a row shown under two ids: GPT-2's <|endoftext|>, its bos and its eos)
        seen: set[str] = set()
        for i, t in enumerate(new):
            if t in seen:
                new[i] = _unused_name(f"{t[:-1]}|{i}>" if t.endswith(">") else f"{t}|{i}", taken | set(new))
            seen.add(new[i])
    tok = json.loads(json.dumps(tok))
    model = tok["model"]
    if model["type"] == "Unigram":
        scores = {piece: score for piece, score in model["vocab"]}
        model["vocab"] = [[t, scores.get(t, 0.0) if i >= len(SPECIAL_TOKENS) else 0.0] for i, t in enumerate(new)]
        model["unk_id"] = UNK_ID
    else:
        model["vocab"] = {t: i for i, t in enumerate(new)}
        if model.get("unk_token") is not None and not keep_names:
            model["unk_token"] = SPECIAL_TOKENS[UNK_ID]
    old_added = {a["id"]: a for a in tok.get("added_tokens", [])}
    added = []
    for i, h in enumerate(order):
        if i < len(SPECIAL_TOKENS) and not keep_names:
            added.append({"id": i, "content": SPECIAL_TOKENS[i], "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
        elif h in old_added and (not keep_names or new[i] == old_added[h]["content"]):
            # (under its new name: fairseq's own <s> is an added token of M2M-100's tokenizers; with `keep_names`,
            # only under its own: a second id of one row is no text's)
            added.append({**old_added[h], "id": i, "content": new[i]})
    tok["added_tokens"] = added
    tok["post_processor"] = None  # tfcli adds </s> and <s> itself
    return tok, order


def _unused_name(name: str, taken: set[str]) -> str:
    """`name`, or with a number after it where a token is spelled so already."""
    out, n = name, 1
    while out in taken:
        out, n = f"{name}{n}", n + 1
    taken.add(out)
    return out


def permute_vocabulary(tok: dict, rows: list[int], names: dict[int, str]) -> dict:
    """`tok` with new id i holding old id rows[i]'s token (named names[i] where given); an old id not in `rows`
    is left out. For an export whose vocabulary layout is not tfcli's (M2M100's)."""
    tokens = vocab_list(tok)
    new = [names.get(i, tokens[r]) for i, r in enumerate(rows)]
    where = {r: i for i, r in enumerate(rows)}
    tok = json.loads(json.dumps(tok))
    model = tok["model"]
    if model["type"] == "Unigram":
        scores = dict(model["vocab"]) if model["vocab"] else {}
        model["vocab"] = [[t, scores.get(tokens[r], 0.0)] for t, r in zip(new, rows)]
        if model.get("unk_id") is not None:
            model["unk_id"] = where[model["unk_id"]]
    else:
        model["vocab"] = {t: i for i, t in enumerate(new)}
        if model.get("unk_token") is not None and model["unk_token"] in tokens:
            model["unk_token"] = new[where[tokens.index(model["unk_token"])]]
    tok["added_tokens"] = [{**a, "id": where[a["id"]], "content": new[where[a["id"]]]}
                           for a in tok.get("added_tokens", []) if a["id"] in where]
    return tok
