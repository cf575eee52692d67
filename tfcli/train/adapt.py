"""What a fine-tuning run trains: every weight (the default), all but the frozen parts (`train.freeze`), or low-rank
adapters on the frozen model (`train.lora_rank`, tfcli/model/lora.py)."""

from __future__ import annotations

import fnmatch
from torch import nn

from tfcli import checkpoint, checkpoint_meta
from tfcli.errors import ConfigError
from tfcli.model import lora
from tfcli.train.config import TrainConfig

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
