"""Training options: one dataclass, filled from a config file (`train:` and `model:` sections), then flags.

Precedence, lowest first: defaults < config file < `--set section.key=value` < explicit flags. On `--resume` the
run's saved config is the base instead of the defaults, and the architecture may not change.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from tfcli.config import from_dict, load_config_file, parse_overrides, to_dict
from tfcli.errors import ConfigError
from tfcli.model.config import LORA_TARGETS, RENAMED, ModelConfig, model_config_fields

SECTIONS = ("train", "model")
PLAN_MIN_STEPS = 10  # a time budget is planned from at least this many measured steps


@dataclass
class TrainConfig:
    """Everything `tfcli train` does besides the architecture (which is `arch` plus the `model:` section)."""

    ALIASES: ClassVar[dict[str, str]] = {"precision": "dtype"}  # old key spellings that still work (saved runs too)

    data: str = ""  # the prepared directory (`tfcli prepare`)
    out: str = ""  # the run directory: metrics.jsonl, config.yaml, checkpoints/
    arch: str = "small"  # a preset (tfcli.model.PRESETS); the `model:` section overrides its fields
    # batching
    max_tokens: int = 4096  # padded tokens per batch (per side), per micro-batch and per process
    max_sentences: int = 0  # at most this many sentences per batch (0: no limit)
    max_len: int = 0  # seq2seq: longer sentences are truncated; LM: the block length (0: the model's max_len)
    bpe_dropout: float = 0.0  # BPE-dropout: training sentences re-cut with each merge skipped with probability P
    # a multilingual directory: each epoch draws direction d's rows in proportion to n_d^(1/T) (repeating rows where
    # that is more than it has), so that small pairs count for more than their share; 1: every row once
    lang_temperature: float = 5.0
    # optimisation
    lr: float = 5e-4  # peak learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0  # AdamW's decoupled decay, applied to matrices only (not biases, norms)
    # adamw, or muon: Muon (orthogonalised momentum) for the layers' weight matrices, AdamW for the rest
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_lr: float = 0.02  # muon: Muon's peak learning rate (the schedule scales it as it scales lr)
    muon_momentum: float = 0.95  # muon: Muon's momentum (Nesterov)
    schedule: Literal["inverse_sqrt", "cosine", "constant"] = "inverse_sqrt"
    warmup: int = 4000  # linear warmup steps
    min_lr: float = 0.0  # cosine: the floor reached at the last step
    max_steps: int = 0  # optimizer updates (0: no limit)
    max_epochs: int = 20  # passes over the training data (0: no limit)
    # A wall-clock budget for the whole run, validations included (0: none). With max_steps 0, the number of steps
    # is planned at the end of warmup from the speed measured so far (so a cosine schedule ends on time), written
    # to the log and the config, and planned again at validations if the speed changes; the run stops at the
    # budget at the latest.
    max_minutes: float = 0.0
    grad_accum: int = 1  # micro-batches per update (per process)
    clip_norm: float = 1.0  # gradient clipping by global norm (0: off)
    label_smoothing: float = 0.1
    # R-Drop (Liang et al. 2021): each batch through the model twice (two dropout masks), the loss plus alpha times
    # the symmetric KL between the two output distributions (0: off, the loss as it is without it, bit for bit)
    rdrop: float = 0.0
    seed: int = 1
    # logging, validation, checkpoints
    log_every: int = 100  # steps between metrics lines
    valid_every: int = 1000  # steps between validations; each validation also writes a checkpoint
    valid_split: str = "valid"
    valid_bleu: bool = True  # translation: greedy-decode the valid set and score it with sacrebleu
    bleu_max_sentences: int = 500  # decode at most this many valid sentences for BLEU (0: all)
    early_stop_metric: Literal["loss", "ppl", "bleu"] = "loss"  # also decides which checkpoint is BEST
    patience: int = 0  # stop after this many validations without improvement (0: never stop early)
    keep_last: int = 5  # checkpoints kept besides the best (what `tfcli average-checkpoints` averages by default)
    average_last: int = 0  # at the end, average the last K checkpoints into checkpoints/avg-lastK (0: off)
    tensorboard: bool = False  # also write TensorBoard events to RUN/tensorboard (pip install 'tfcli[tensorboard]')
    # hardware
    device: str = "auto"  # auto: cuda (this process's local rank) if available, else cpu
    # auto: bf16 on a GPU that has it, else fp32; native-bf16: also bf16 on a CPU whose oneDNN multiplies bf16
    # natively (AMX tiles: Intel Xeon 4th gen and later; AVX-512 BF16: AMD Zen 4 and later), faster than fp32 there
    dtype: Literal["auto", "native-bf16", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False  # torch.compile the model
    # keep each layer's input only and recompute its activations in the backward: much less memory (a large
    # model's fine-tuning or LoRA), about a third more compute
    activation_checkpointing: bool = False
    # under torchrun: each process holds a shard of the parameters, gradients and optimizer state (torch's FSDP,
    # fully_shard), for a model whose training state one device cannot hold; off: DDP, a whole copy each
    fsdp: bool = False
    # batches padded to shape buckets: lengths up to a multiple of this, rows up to what max_tokens allows at that
    # length, so that a compiled model meets few shapes (one graph each); 0: 8 with compile, else 1 (no extra padding)
    pad_multiple: int = 0
    # static: one compiled graph per shape bucket (fastest kernels; a new bucket compiles once, in the first epoch);
    # dynamic: graphs with symbolic rows and lengths, shared by the buckets (fewer compilations where buckets are many)
    compile_shapes: Literal["static", "dynamic"] = "static"
    threads: int = 0  # CPU threads for torch (0: torch's default, one per core)
    profile: str = ""  # "A-B": steps A..B under torch.profiler, tables in RUN/profile/ (tfcli/train/profiling.py)
    peak_flops: float = 0.0  # the GPU's dense peak FLOP/s, for MFU (0: from its name and the precision; train/flops.py)
    resume: bool = False  # continue the run in `out` from its latest checkpoint
    init_from: str = ""  # fine-tune: start from this checkpoint's weights (its architecture; fresh optimizer, schedule)
    # what a fine-tuning run trains (tfcli/train/adapt.py): every weight but the frozen parts, or LoRA adapters
    freeze: list[str] = field(default_factory=list)  # embeddings, encoder, decoder, or globs of parameter names
    lora_rank: int = 0  # train rank-R adapters (LoRA) on the frozen --init-from model (0: off); saved alone
    lora_alpha: float = 16.0  # the adapters' output is scaled by alpha / rank
    lora_dropout: float = 0.0  # dropout on the adapters' input
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # the layers adapted

    def validate(self) -> None:
        if self.pad_multiple < 0:
            raise ConfigError("train.pad_multiple must be >= 0 (0: 8 with compile, else no extra padding)")
        positive = ("max_tokens", "lr", "grad_accum", "log_every", "valid_every", "keep_last", "muon_lr")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name}: must be positive, got {getattr(self, name)}")
        non_negative = ("max_sentences", "max_len", "warmup", "min_lr", "max_steps", "max_epochs", "max_minutes",
                        "clip_norm", "weight_decay", "patience", "average_last", "bleu_max_sentences", "adam_eps",
                        "threads")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name}: must not be negative, got {getattr(self, name)}")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(f"train.muon_momentum: must be in [0, 1), got {self.muon_momentum}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {self.betas}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing: must be in [0, 1), got {self.label_smoothing}")
        if self.lora_rank < 0 or self.lora_alpha <= 0 or not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"train.lora_*: rank must be >= 0 (0: off), alpha positive, dropout in [0, 1); got "
                              f"{self.lora_rank}, {self.lora_alpha}, {self.lora_dropout}")
        if self.lora_rank and self.freeze:
            raise ConfigError("train.freeze: a LoRA run (lora_rank) trains its adapters alone; give one or the other")
        if self.rdrop < 0:
            raise ConfigError(f"train.rdrop: R-Drop's alpha must not be negative, got {self.rdrop} (0: off)")
        if self.lang_temperature <= 0:
            raise ConfigError(f"train.lang_temperature: must be positive, got {self.lang_temperature} (1: every row once)")
        if not 0.0 <= self.bpe_dropout < 1.0:
            raise ConfigError(f"train.bpe_dropout: must be in [0, 1), got {self.bpe_dropout}")
        if self.max_len == 1:
            raise ConfigError("train.max_len: must be at least 2 (or 0 for the model's max_len)")
        if self.max_steps == 0 and self.max_epochs == 0 and self.patience == 0 and self.max_minutes == 0:
            raise ConfigError("train: no stopping rule; set max_steps, max_epochs, max_minutes or patience")
        if self.max_minutes and not self.max_steps and self.warmup < PLAN_MIN_STEPS:
            raise ConfigError(f"train.max_minutes: the step count is planned from the speed measured during warmup; "
                              f"set warmup to at least {PLAN_MIN_STEPS} steps (or give max_steps)")
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr ({self.min_lr}) is above the peak lr ({self.lr})")
        from tfcli.train.profiling import parse_steps  # (profiling imports torch; this config does not)

        parse_steps(self.profile)
        if self.early_stop_metric == "bleu" and not self.valid_bleu:
            raise ConfigError("train.early_stop_metric: 'bleu' needs valid_bleu: true")


def _sections(data: dict, where: str) -> tuple[dict, dict]:
    for key in data:
        if key not in SECTIONS:
            raise ConfigError(f"{where}: unknown section '{key}' (expected: {', '.join(s + ':' for s in SECTIONS)})")
        if not isinstance(data[key], dict):
            raise ConfigError(f"{where}: section '{key}' must be a mapping")
    return dict(data.get("train") or {}), dict(data.get("model") or {})


def _check_model_keys(model: dict, where: str) -> None:
    """Unknown `model:` keys are caught here, before any data is read (the values are checked by `preset`)."""
    names = model_config_fields()
    for key in model:
        if str(key).replace("-", "_") not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: model.{key}: unknown config key{hint}")
    if "kind" in model:
        raise ConfigError(f"{where}: model.kind comes from the preset (--arch); choose an LM preset for an LM")
    for key in ("src_vocab_size", "tgt_vocab_size"):
        if key in model:
            raise ConfigError(f"{where}: model.{key} comes from the prepared data; do not set it")


def load_train_config(
    config_file: str | Path | None = None,
    flags: dict | None = None,
    sets: list[str] | None = None,
    saved: dict | None = None,
) -> tuple[TrainConfig, dict]:
    """Resolve the training config; returns (TrainConfig, model field overrides for the preset).

    `flags` are the CLI's values (None = not given). `saved` is the resumed checkpoint's config.json, whose `train`
    section becomes the base.
    """
    given, model = train_settings(config_file, flags, sets)
    return resolve_train_config(given, saved), model


def train_settings(
    config_file: str | Path | None, flags: dict | None, sets: list[str] | None
) -> tuple[dict, dict]:
    """What this invocation sets, read once: (train keys, model keys), from the config file, then --set, then the
    flags (None = not given)."""
    model: dict = {}
    given: dict = {}
    if config_file is not None:
        t, m = _sections(load_config_file(config_file), str(config_file))
        _check_model_keys(m, str(config_file))
        given.update(t)
        model.update(m)
    if sets:
        t, m = _sections(parse_overrides(sets), "--set")
        _check_model_keys(m, "--set")
        given.update(t)
        model.update(m)
    given.update({k: v for k, v in (flags or {}).items() if v is not None})
    return given, model


def resolve_train_config(given: dict, saved: dict | None = None) -> TrainConfig:
    """`given` (train_settings) over the defaults, or on resume over `saved["train"]` (the checkpoint's config.json)."""
    old = dict(saved["train"]) if saved else {}
    if old.get("arch") in RENAMED:  # a run saved under a preset's earlier name
        old["arch"] = RENAMED[old["arch"]]
    cfg = from_dict(TrainConfig, {**old, **given}, "train")
    if saved:
        _resume_limits(cfg, saved["train"], given)
    return cfg


def _resume_limits(cfg: TrainConfig, old: dict, given: dict) -> None:
    """What max_steps and max_minutes mean when a run is resumed; both count the whole run, not this session.

    - Neither changed (the config that started the run, max_steps: 0 included): a time budget keeps the step count
      it planned (the cosine's length), and the run ends where the uninterrupted one would have.
    - A new max_steps, and no new max_minutes: that many steps, and the old time budget no longer applies.
    - A new max_minutes (the whole run's budget, time already spent included), and no max_steps: the step count is
      planned again from the speed measured after resuming.
    The learning rate then continues smoothly to the new end (Trainer: schedule anchor)."""
    planned = int(old.get("max_steps") or 0)
    old_minutes = float(old.get("max_minutes") or 0.0)
    new_steps = bool(given.get("max_steps")) and int(given["max_steps"]) != planned
    new_minutes = "max_minutes" in given and float(given["max_minutes"]) != old_minutes
    if new_steps and not new_minutes:
        cfg.max_minutes = 0.0
    elif new_minutes and not given.get("max_steps"):
        cfg.max_steps = 0
    elif planned and cfg.max_minutes and not cfg.max_steps:
        cfg.max_steps = planned


def config_to_yaml(cfg: TrainConfig, model_cfg: ModelConfig) -> str:
    import yaml

    return yaml.safe_dump({"train": to_dict(cfg), "model": to_dict(model_cfg)}, sort_keys=False)


def differences(a, b) -> list[str]:
    """Fields that differ between two dataclasses of the same type, as 'name: a -> b'."""
    return [
        f"{f.name}: {getattr(a, f.name)} -> {getattr(b, f.name)}"
        for f in dataclasses.fields(a)
        if getattr(a, f.name) != getattr(b, f.name)
    ]
