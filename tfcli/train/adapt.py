"""What a fine-tuning run trains: every weight (the default), all but the frozen parts (`train.freeze`), or low-rank
adapters on the frozen model (`train.lora_rank`, tfcli/model/lora.py); and the model it starts from, with rows for
the languages its data adds (`prepare --add-language`: tfcli/data/conventions.py)."""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from tfcli import checkpoint, checkpoint_meta
from tfcli.data.languages import LANGUAGE_TOKENS
from tfcli.data.tokenizer import load_tokenizer
from tfcli.errors import ConfigError
from tfcli.model import lora
from tfcli.model.config import ModelConfig
from tfcli.specials import SPECIAL_TOKENS
from tfcli.train.config import TrainConfig

# what a fine-tuned checkpoint keeps of the one it started from: how its texts and languages are written
INHERITED = ("text", LANGUAGE_TOKENS)


def new_rows(meta: dict, data) -> dict[str, dict[int, int | None]]:
    """{side: {new token's id: the id of the row it starts as, None for the mean}} of the languages the prepared
    `data` adds to checkpoint `meta`'s vocabulary (empty where it adds none)."""
    added = data.meta.get("new_languages") or {}
    rows = {}
    for side, path in data.tokenizer_files().items():
        ours = checkpoint.tokenizer(meta, side if meta["model"]["kind"] == "seq2seq" else "tgt")
        theirs = load_tokenizer(path, any_names=True)
        grown = {theirs.token_to_id(a["token"]): (ours.token_to_id(a["like"]) if a["like"] else None)
                 for a in added.values() if ours.token_to_id(a["token"]) is None}
        if grown:
            rows[side] = grown
    return rows


def inherited(meta: dict, data) -> dict:
    """What a run's checkpoints keep of checkpoint `meta` it was initialised from (INHERITED), the languages its
    data adds joined to an M2M-100-style model's language tokens."""
    out = {k: meta[k] for k in INHERITED if k in meta}
    added = data.meta.get("new_languages") or {}
    if LANGUAGE_TOKENS in out and added:
        out[LANGUAGE_TOKENS] = {**out[LANGUAGE_TOKENS], **{code: a["token"] for code, a in added.items()}}
    return out


def grown(meta: dict, cfg: ModelConfig, rows: dict[str, dict[int, int | None]], device) -> nn.Module:
    """Checkpoint `meta`'s model at `cfg`'s (larger) vocabulary sizes: every row it had, and each new token's
    row (embeddings, output weights and bias) a copy of its named language's row, or the mean of the token rows
    (the specials left out: an imported model's absent ones have an output bias of -1e9)."""
    from tfcli.model import build_model

    old, _ = checkpoint.load(meta, device)
    model = build_model(cfg).to(device)
    before = old.state_dict()
    with torch.no_grad():
        for name, t in model.state_dict().items():
            src = before[name]
            if src.shape == t.shape:
                t.copy_(src)
                continue
            t[: src.shape[0]] = src
            for row, like in rows["src" if name.startswith("encoder.") and "src" in rows else "tgt"].items():
                t[row] = src[like] if like is not None else src[len(SPECIAL_TOKENS):].mean(0)
    return model

# the names `train.freeze` takes besides glob patterns of parameter names
PARTS = {
    "embeddings": ("*embed.*", "lm_head.*"),
    "encoder": ("encoder.*",),
    "decoder": ("decoder.*",),
}


def lora_config(cfg: TrainConfig) -> lora.LoraConfig | None:
    if not cfg.lora_rank:
        return None
    return lora.LoraConfig(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, lora.check_targets(cfg.lora_targets))


def trainable(model: nn.Module, cfg: TrainConfig, resumed: dict | None) -> dict | None:
    """Set what `model` trains; returns the checkpoint's "adapter" record for a LoRA run (None otherwise).
    `resumed`: the resumed checkpoint's meta (its adapters are already attached by checkpoint.load)."""
    wanted = lora_config(cfg)
    if resumed is not None and (resumed.get("adapter") is not None or wanted is not None):
        had = resumed.get("adapter")
        old = lora.LoraConfig.from_dict(had) if had else None
        if old != wanted:
            raise ConfigError(f"--resume: what the run trains cannot change (LoRA {_describe(old)} -> "
                              f"{_describe(wanted)})")
        return had
    if wanted is not None:
        if not cfg.init_from:
            raise ConfigError("train.lora_rank: adapters adapt a trained model; give it with --init-from CKPT")
        base = checkpoint_meta.resolve(cfg.init_from).resolve()
        record = {"base": str(base), "fingerprint": checkpoint.model_fingerprint(model), **wanted.to_dict()}
        lora.attach(model, wanted)
        return record
    if cfg.freeze:
        freeze(model, cfg.freeze)
    return None


def freeze(model: nn.Module, parts: list[str]) -> None:
    """Stop training the parameters named by `parts`: PARTS' names, or glob patterns of parameter names."""
    params = dict(model.named_parameters(remove_duplicate=False))  # (a tied parameter under each of its names)
    names = list(params)
    frozen = set()
    for part in parts:
        patterns = PARTS.get(part, (part,))
        hit = {n for n in names for p in patterns if fnmatch.fnmatchcase(n, p)}
        if not hit:
            raise ConfigError(f"train.freeze: {part!r} names no parameter of the model (give {', '.join(PARTS)} or "
                              f"a pattern of parameter names such as 'decoder.layers.0.*')")
        frozen |= hit
    if {id(params[n]) for n in frozen} == {id(p) for p in params.values()}:
        raise ConfigError(f"train.freeze: {', '.join(parts)} leaves nothing to train")
    for name in frozen:
        params[name].requires_grad_(False)


def _describe(c: lora.LoraConfig | None) -> str:
    return "off" if c is None else f"rank {c.rank}, alpha {c.alpha:g}, dropout {c.dropout:g}, {','.join(c.targets)}"
