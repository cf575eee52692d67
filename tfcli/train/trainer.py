"""The training loop: teacher-forced encoder-decoder on parallel data, or a decoder-only LM on a text stream.

One step = world_size x grad_accum micro-batches taken in order from the epoch's deterministic batch list (a
remainder too small for a step is skipped; the per-epoch shuffle changes which batches that is). The loss
of a step is the sum over all its target tokens divided by their total count (over micro-batches and processes), so
the update does not depend on how the step is split across processes or accumulation. Everything a step depends on
(weights, optimizer moments, RNG states, the position in the batch list) goes into each checkpoint, so a resumed run
reaches the same weights as an uninterrupted one.

A step whose gradients are not finite (inf or NaN: a loss that blew up) makes no update: the weights and the
optimizer's state stay as they were (in fp16 the GradScaler skips it and lowers its scale), the step counts on, and
the log says how many were skipped. DIVERGED_AFTER of them in a row (in fp16, of those whose loss was not finite
either) end the run with an error at the next log step or checkpoint, which is then not written; and no checkpoint
is deleted (`--keep-last`) while updates are being skipped, so that those from before a divergence are still there
to go back to.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tfcli import checkpoint

from tfcli import checkpoint_meta
from tfcli.config import from_dict, to_dict
from tfcli.data.prepared import PreparedData
from tfcli.console import verbose_enabled
from tfcli.errors import CheckpointError, ConfigError, TfcliError
from tfcli.io import atomic_write_text, run_lock
from tfcli.model.transformer import build_model, count_parameters, recompute_activations
from tfcli import distributed
from tfcli.train import adapt
from tfcli.train.checkpoints import CHECKPOINTS, pack_state, prune, restore_state, resume_point, step_dirs, step_name
from tfcli.train.budget import Budget
from tfcli.train.config import (
    PLAN_MIN_STEPS, TrainConfig, config_to_yaml, resolve_train_config, train_settings,
)
from tfcli.train.data import Batch, ChatData, PairData, ParallelData, StreamData
from tfcli.train.flops import gpu_peak_flops, train_flops
from tfcli.train.log import MetricsLog, ppl
from tfcli.train.model_config import run_model_config
from tfcli.train.optim import MuonAdamW, muon_parameters, step_if_finite
from tfcli.train.loss import Objective, batch_loss
from tfcli.train.profiling import StepProfiler
from tfcli.train.schedule import learning_rate
from tfcli.train.validation import greedy_bleu, valid_loss
from tfcli.torch_compat import cpu_has_native_bf16, fused_adamw, grad_scaler

DIVERGED_AFTER = 10  # updates skipped in a row (inf or NaN gradients) that end a run


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    checkpoint: Path | None  # the last one written
    best: Path | None
    interrupted: bool = False
    early_stopped: bool = False


class StopRequest:
    """SIGINT/SIGTERM: finish the current step, save, exit 130. A second signal stops at once, without saving."""

    def __init__(self, log: MetricsLog):
        self.requested = False
        self.log = log
        self._old: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.log.print(f"{signal.Signals(signum).name}: stopping after this step and saving a checkpoint "
                       "(signal again to quit without saving)")


def train_precision(name: str, device: torch.device) -> str:
    """train.dtype resolved for `device`: fp32, bf16 or fp16."""
    if name == "native-bf16" and device.type == "cpu":
        return "bf16" if cpu_has_native_bf16() else "fp32"
    if name in ("auto", "native-bf16"):
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return "bf16" if cuda_bf16 else ("fp16" if device.type == "cuda" else "fp32")
    if name == "fp16" and device.type != "cuda":
        raise ConfigError("train.dtype: fp16 needs a CUDA GPU; use fp32 or bf16 on the CPU")
    return name


class Trainer:
    def __init__(self, cfg: TrainConfig, model_overrides: dict | None = None, saved: dict | None = None):
        self.cfg = cfg
        self.dist, self.device = distributed.setup(cfg.device)
        self.main = self.dist.is_main
        saved = self._open_run(saved)
        self._setup_hardware(model_overrides, saved)
        self._setup_data()
        self._setup_model()
        self._setup_state()
        first_epoch = self._setup_schedule(saved)
        self._open_outputs(first_epoch)

    def _open_run(self, saved: dict | None) -> dict | None:
        """The run directory, and where a resumed run continues from; returns the saved metadata to resume with."""
        cfg = self.cfg
        if not cfg.data:
            raise ConfigError("train.data: no prepared directory given (tfcli train DATA ...)")
        if not cfg.out:
            raise ConfigError("train.out: no run directory given (--out RUN)")
        self.run_dir = Path(cfg.out)
        self.ckpt_dir = self.run_dir / CHECKPOINTS
        self.resume_from = resume_point(self.run_dir) if cfg.resume else None
        if saved is None and self.resume_from is not None:
            saved = checkpoint_meta.read_meta(self.resume_from)
        if not cfg.resume and (self.ckpt_dir / "LATEST").exists():
            raise TfcliError(f"{self.run_dir}: already holds a training run; pass --resume to continue it, "
                             "or choose another --out")
        return saved

    def _setup_hardware(self, model_overrides: dict | None, saved: dict | None) -> None:
        """The prepared data's metadata, the model's config, the precision and the GPU's peak."""
        cfg = self.cfg
        if cfg.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("train.tensorboard: the tensorboard package is not installed: pip install "
                              "'tfcli[tensorboard]' (or train without --tensorboard)")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.prepared = PreparedData(cfg.data)
        self.src_lengths = self.prepared.source_lengths()  # (recorded in each checkpoint: translate's auto splitting)
        self.model_cfg = run_model_config(cfg, self.prepared, model_overrides or {}, saved)
        self.precision = train_precision(cfg.dtype, self.device)
        self.gpu_name, self.peak_flops = None, None  # the peak per GPU, for MFU
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            self.gpu_name = torch.cuda.get_device_name(self.device)
            self.peak_flops = cfg.peak_flops or gpu_peak_flops(self.gpu_name, self.precision)

    def _setup_data(self) -> None:
        cfg, mc = self.cfg, self.model_cfg
        self.max_len = cfg.max_len or mc.max_len
        if self.max_len > mc.max_len and mc.positions == "learned":
            raise ConfigError(f"train.max_len ({self.max_len}) is longer than the model's learned positions "
                              f"(model.max_len {mc.max_len}); raise model.max_len or lower --max-len")
        parallel = self.prepared.kind == "parallel"
        chat = self.prepared.kind == "chat"  # (a chat model's conversations: drawn from as pairs are)
        Data = ((PairData if mc.kind == "lm" else ParallelData) if parallel else ChatData if chat else StreamData)
        if cfg.bpe_dropout and not parallel:
            raise ConfigError("train.bpe_dropout: re-cuts translation pairs; a language model's stream is not re-cut")
        extra = {"bpe_dropout": cfg.bpe_dropout} if cfg.bpe_dropout else {}
        train = self.prepared.split_names("train")
        corpora = self.prepared.meta.get("corpora")
        if parallel or chat:
            extra["temperature"] = cfg.lang_temperature
            if corpora and len(train) > 1:  # (corpora are drawn from by their weights, not by temperature)
                extra["weights"] = [corpora[s.split(".", 1)[1]] for s in train]
        self.pad_multiple = cfg.pad_multiple or (8 if cfg.compile else 1)
        self.train_data = Data(self.prepared, train if len(train) > 1 else train[0], self.max_len, cfg.max_tokens,
                               cfg.max_sentences, cfg.seed, pad_multiple=self.pad_multiple, **extra)
        # {name: (split, data)}: the valid split, or a multilingual directory's one per direction, each reported
        self.valid_data = {}
        for split in self.prepared.split_names(cfg.valid_split):
            if split in self.prepared.splits:
                name = split.split(".", 1)[1] if split != cfg.valid_split else split
                self.valid_data[name] = (split, Data(self.prepared, split, self.max_len, cfg.max_tokens,
                                                     cfg.max_sentences, cfg.seed, pad_multiple=self.pad_multiple))
        if not self.valid_data and cfg.patience:
            raise ConfigError(f"train.patience: early stopping needs a '{cfg.valid_split}' split in {cfg.data}")
        if not parallel and cfg.early_stop_metric == "bleu":
            raise ConfigError("train.early_stop_metric: 'bleu' is for translation; use loss or ppl for a language model")

    def _setup_model(self) -> None:
        """The model (new, resumed or initialised from a checkpoint), its optimizer, and the wrapped objective."""
        cfg = self.cfg
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)
        resumed = None
        if self.resume_from is not None:  # (a LoRA run's frozen base mapped, as below)
            self.raw, resumed = checkpoint.load(self.resume_from, self.device, mapped=bool(cfg.lora_rank),
                                                merge=False)
        elif cfg.init_from:  # its weights in this run's config (dropout), mapped: in memory once, copied if written
            meta = checkpoint_meta.read_meta(cfg.init_from)
            rows = adapt.new_rows(meta, self.prepared)  # (languages the data adds: their rows grown)
            if rows and cfg.lora_rank:
                raise ConfigError("train.lora_rank: the data adds languages (prepare --add-language), whose new rows "
                                  "are trained whole, not by adapters: fine-tune fully (--freeze may hold parts)")
            self.raw = (adapt.grown(meta, self.model_cfg, rows, self.device) if rows else
                        checkpoint.load({**meta, "model": to_dict(self.model_cfg)}, self.device, mapped=True)[0])
        else:
            self.raw = build_model(self.model_cfg).to(self.device)
        self.adapter = adapt.trainable(self.raw, cfg, resumed)  # (the "adapter" record of a LoRA run's checkpoints)
        self.inherited = (adapt.inherited(checkpoint_meta.read_meta(cfg.init_from), self.prepared) if cfg.init_from
                          else {})  # (what its checkpoints keep of the one it started from)
        recompute_activations(self.raw, cfg.activation_checkpointing)
        self.raw.train()
        torch.manual_seed(cfg.seed + self.dist.rank)  # each rank its own dropout stream
        # DDP, FSDP and torch.compile wrap the model together with its loss
        self.objective = Objective(self.raw, cfg.label_smoothing, cfg.rdrop)
        if cfg.fsdp:
            self._check_fsdp()
            distributed.shard_model(self.objective, self.raw, self.device)
        self.optimizer = self._optimizer()
        self.scaler = grad_scaler(self.device.type, enabled=self.precision == "fp16")
        # with shape buckets, one static graph per bucket, or symbolic graphs the buckets share (compile_shapes)
        dynamic = True if cfg.compile_shapes == "dynamic" else (False if self.pad_multiple > 1 else None)
        self.model = torch.compile(self.objective, dynamic=dynamic) if cfg.compile else self.objective
        if not cfg.fsdp:
            self.model = distributed.wrap(self.model, self.dist, self.device)

    def _check_fsdp(self) -> None:
        cfg = self.cfg
        if not self.dist.enabled:
            raise ConfigError("train.fsdp: shards the model over the processes torchrun starts; run under torchrun "
                              "(torchrun --nproc_per_node N -m tfcli.cli train ...), or drop --fsdp")
        if cfg.optimizer == "muon":
            raise ConfigError("train.fsdp: Muon orthogonalises whole weight matrices, which FSDP's processes hold "
                              "in shards; use --optimizer adamw")
        if cfg.early_stop_metric == "bleu":
            raise ConfigError("train.early_stop_metric: 'bleu' decodes with the whole model, which train.fsdp's "
                              "processes hold in shards; use loss")

    def _setup_state(self) -> None:
        """The counters a checkpoint keeps: fresh, or a resumed run's."""
        self.step, self.epoch, self.pos = 0, 0, 0
        self.elapsed = 0.0  # training seconds of earlier runs of this run directory
        # (step, lr): where a run whose end moved (resumed with other limits, or planned again) continues its cosine
        # from, instead of jumping
        self.anchor: tuple[int, float] | None = None
        self.saved_total: int | None = None  # the total steps the resumed run was scheduled for
        self.planned = False  # max_steps is the time budget's plan (revised at validations)
        self.best: dict | None = None  # {"value", "step", "name"}
        self.bad_validations = 0
        self.last_valid: dict = {}
        self.in_row = 0  # diverging steps in a row (`_step`; on the device while training: never read at a step)
        if self.resume_from is not None:
            self._load_state(self.resume_from)
            self.planned = self.planned and bool(self.cfg.max_minutes and self.cfg.max_steps)  # a plan this run keeps
        self.in_row = torch.tensor(self.in_row, device=self.device)

    def _setup_schedule(self, saved: dict | None) -> list:
        """The steps per epoch, the run's length and its learning-rate schedule, and the time budget's plan;
        returns the first epoch's batches."""
        cfg = self.cfg
        self.group_size = self.dist.world_size * cfg.grad_accum
        t0 = time.perf_counter()
        first_epoch = self.train_data.batches(self.epoch)
        epoch_setup_s = time.perf_counter() - t0  # each epoch's batch list (and BPE-dropout's re-cut), for the plan
        if not first_epoch:
            raise TfcliError(f"{cfg.data}: the training data is too small for one batch "
                             f"(a language model needs more than --max-len {self.max_len} tokens)")
        self.steps_per_epoch = len(first_epoch) // self.group_size
        if not self.steps_per_epoch:
            raise TfcliError(f"{cfg.data}: {len(first_epoch)} batches per epoch, fewer than one step takes "
                             f"({self.dist.world_size} processes x grad_accum {cfg.grad_accum}); lower --max-tokens")
        if self.resume_from is not None and self.saved_total is None:  # a checkpoint from before total_steps was kept
            old = (saved or {}).get("train", {})
            self.saved_total = _total(old.get("max_steps") or 0, old.get("max_epochs") or 0, self.steps_per_epoch)
        self.total_steps = _total(cfg.max_steps, cfg.max_epochs, self.steps_per_epoch)
        if cfg.schedule == "cosine" and not self.total_steps and not cfg.max_minutes:
            raise ConfigError("train.schedule: cosine needs max_steps, max_epochs or max_minutes to know where it ends")
        new_budget = cfg.max_minutes != float((saved or {}).get("train", {}).get("max_minutes") or 0.0)
        if self.resume_from is not None and new_budget and cfg.max_minutes and 60 * cfg.max_minutes <= self.elapsed:
            raise ConfigError(f"train.max_minutes: the run has trained {self.elapsed / 60:.1f} minutes already, and "
                              f"max_minutes counts the whole run; give more than that, or --max-steps N")
        # the step that plans the budget: the end of warmup, or (a resumed run re-planned) a few steps from here
        plan_at = max(cfg.warmup, self.step + PLAN_MIN_STEPS if self.resume_from else 0) \
            if cfg.max_minutes and not cfg.max_steps else 0
        self.budget = Budget(cfg.max_minutes, cfg.valid_every, plan_at, epoch_setup_s / self.steps_per_epoch,
                             self._time, self._mean)
        self._continue_schedule()
        return first_epoch

    def _open_outputs(self, first_epoch: list) -> None:
        """The run directory's checkpoints folder, config.yaml and logs; the run's summary on the console."""
        if self.main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            for junk in self.ckpt_dir.glob(".step-*"):  # temp dirs of a save that was killed
                shutil.rmtree(junk, ignore_errors=True)
            atomic_write_text(self.run_dir / "config.yaml", config_to_yaml(self.cfg, self.model_cfg))
        self.log = MetricsLog(self.run_dir, self.main, self.step if self.resume_from else None, self.cfg.tensorboard,
                              self.total_steps)
        self.profiler = StepProfiler(self.cfg.profile, self.run_dir, self.device, self.main)
        self._announce(first_epoch)
        self._warn_short()
        self._reset_interval()
        self.elapsed_at_start, self.step_at_start = self.elapsed, self.step

    # --- setup ----------------------------------------------------------------------------------------------------

    def autocast(self):
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def _optimizer(self) -> torch.optim.Optimizer:
        """AdamW, or Muon for the layers' weight matrices and AdamW for the rest (tfcli/train/optim.py); weight
        decay on matrices only (biases, norms are not decayed)."""
        params = [p for p in self.raw.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        other = [p for p in params if p.dim() < 2]
        if self.cfg.optimizer == "muon":
            muon = muon_parameters(self.raw)
            groups = [
                {"params": [p for p in decay if id(p) in muon], "weight_decay": self.cfg.weight_decay, "muon": True,
                 "lr_scale": self.cfg.muon_lr / self.cfg.lr},
                {"params": [p for p in decay if id(p) not in muon], "weight_decay": self.cfg.weight_decay},
                {"params": other, "weight_decay": 0.0},
            ]
            return MuonAdamW(groups, lr=self.cfg.lr, betas=self.cfg.betas, eps=self.cfg.adam_eps,
                             momentum=self.cfg.muon_momentum, blocks=muon)
        groups = [{"params": decay, "weight_decay": self.cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
        return torch.optim.AdamW(
            groups, lr=self.cfg.lr, betas=tuple(self.cfg.betas), eps=self.cfg.adam_eps,
            fused=fused_adamw(self.device.type) or None,
        )

    def _announce(self, batches: list) -> None:
        if not self.main:
            return
        log, cfg, mc = self.log, self.cfg, self.model_cfg
        resolved = "resolved config:\n" + config_to_yaml(cfg, mc).rstrip()
        log.print(resolved, console=verbose_enabled())  # all of it in RUN/train.log; on the console with -v
        if not verbose_enabled():
            log.print(f"config: {self.run_dir / 'config.yaml'} (every setting; -v prints it here, `tfcli config` "
                      "lists every key with its default)")
        what = ("encoder-decoder" if mc.kind == "seq2seq" else
                "decoder-only translator" if self.prepared.kind == "parallel" else
                "chat model" if self.prepared.kind == "chat" else "decoder-only LM")
        trained = sum(p.numel() for p in self.raw.parameters() if p.requires_grad)  # (tied ones once, as total)
        total = count_parameters(self.raw)
        if trained != total:
            how = f"LoRA rank {cfg.lora_rank} adapters" if self.adapter else f"frozen: {', '.join(cfg.freeze)}"
            how = f" ({trained / 1e6:.3g}M trained: {how})"
        else:
            how = ""
        shape = f"from {cfg.init_from}" if cfg.init_from else cfg.arch  # (a fine-tuning run's is the checkpoint's)
        log.print(f"model: {what} ({shape}), {total / 1e6:.2f}M parameters{how}; "
                  f"device {self.device}, {self.precision}, {self.dist.world_size} process(es)"
                  + (", each holding a shard of the parameters (FSDP)" if cfg.fsdp else ""))
        if self.gpu_name:
            log.print(f"MFU: model FLOPs over {self.peak_flops / 1e12:.0f} TFLOP/s per GPU ({self.gpu_name}, "
                      f"{self.precision}, dense{', train.peak_flops' if cfg.peak_flops else ''})" if self.peak_flops else
                      f"MFU: not logged, the peak of a {self.gpu_name} is not known; set train.peak_flops (dense FLOP/s "
                      "per GPU)")
        if cfg.fsdp and cfg.valid_bleu and self.prepared.kind == "parallel":
            log.print("valid: loss only, no BLEU (with --fsdp each process holds a shard of the weights; translate "
                      "a checkpoint to score it)")
        unit = {"parallel": "sentence pairs", "chat": "conversations"}.get(self.prepared.kind, "tokens in the stream")
        line = f"data: {len(self.train_data)} {unit}, {len(batches)} batches per epoch"
        if mc.kind == "seq2seq":
            d = self.train_data
            real = sum(int(d.src_len[b].sum() + d.tgt_len[b].sum()) for b in batches)
            slots = sum(len(b) * int(d.src_len[b].max() + d.tgt_len[b].max()) for b in batches)
            line += f", {100 * (1 - real / slots):.1f}% padding after length bucketing"
        if self.train_data.truncated:
            line += f"; {self.train_data.truncated} pairs longer than {self.max_len} tokens are truncated"
        log.print(line)
        if self.resume_from is not None:
            planned = f"; {cfg.max_steps} steps planned for the time budget" if cfg.max_minutes and cfg.max_steps else ""
            log.print(f"resuming from {self.resume_from} (step {self.step}, epoch {self.epoch + 1}{planned})")
            limits = [f"max_steps {cfg.max_steps}"] if cfg.max_steps else []
            if cfg.max_minutes:
                limits.append(f"max_minutes {cfg.max_minutes:g} for the whole run ({self.elapsed / 60:.1f} spent"
                              + ("; steps planned again after resuming" if not cfg.max_steps else "") + ")")
            if limits:
                log.print("limits: " + ", ".join(limits))
            if self.anchor and self.anchor[0] == self.step and self.total_steps != self.saved_total:
                log.print(f"schedule: the cosine continues from lr {self.anchor[1]:.3g} at step {self.step} down to "
                          f"{cfg.min_lr:g} at the new end (it does not restart)")
            if self.old_group_size != self.group_size:
                log.print(f"note: {self.old_group_size} batches per step before, {self.group_size} now (processes x "
                          "grad_accum changed): training continues, but not as the same run bit for bit", warning=True)

    # --- the loop -------------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        cfg = self.cfg
        self.interrupted = self.early_stopped = False
        self.saved_step = self.step if self.resume_from is not None else -1
        with StopRequest(self.log) as stop:
            done = bool(cfg.max_steps and self.step >= cfg.max_steps)
            if self.resume_from is not None and (done or (cfg.max_epochs and self.epoch >= cfg.max_epochs)):
                limit = f"max_steps {cfg.max_steps}" if done else f"max_epochs {cfg.max_epochs}"
                self.log.print(f"{self.run_dir}: this run has finished (step {self.step}, {limit}); to train on, "
                               f"resume with a larger --max-steps, --max-epochs or --max-minutes")
            while not done and not (cfg.max_epochs and self.epoch >= cfg.max_epochs):
                batches = self.train_data.batches(self.epoch)
                while self.pos < len(batches):
                    group = batches[self.pos : self.pos + self.group_size]
                    if len(group) < self.group_size:  # the epoch's remainder (a different one each epoch)
                        self.pos = len(batches)
                        continue
                    done = self._train_group(group, stop.requested)
                    if done:
                        break
                else:
                    self.epoch += 1
                    self.pos = 0
            if self.saved_step != self.step:  # an interrupt, or the last epoch ended between validations
                if self.interrupted:
                    self._save(is_best=False)
                else:
                    self.early_stopped = self._validate_and_save()
        self.log.close()
        last = self.ckpt_dir / step_name(self.step)
        best = self.ckpt_dir / self.best["name"] if self.best else None
        if self.main and cfg.average_last and not self.interrupted:
            self._average(cfg.average_last)
        distributed.barrier(self.dist)
        return TrainResult(self.run_dir, self.step, last, best, self.interrupted, self.early_stopped)

    def _train_group(self, group: list, stop_requested: bool) -> bool:
        """One step on the batches `group` (this process's share of them), then its logging, validation and
        checkpoint, and the time budget's plan; returns True when training is done (limits, early stopping, an
        interrupt on any process, the time budget)."""
        cfg = self.cfg
        mine = [self.train_data.collate(b) for b in distributed.shard(group, self.dist)]
        over = bool(cfg.max_minutes) and self._time() >= 60 * cfg.max_minutes
        tokens, stops, overs = distributed.all_reduce_sum(
            [sum(b.tgt_tokens for b in mine), float(stop_requested), float(over)], self.dist, self.device
        )
        if stops:
            self.interrupted = True
            return True
        if overs:
            self.log.print(f"time budget of {cfg.max_minutes:g} minutes reached at step {self.step}"
                           + (f" of {cfg.max_steps} planned" if cfg.max_steps else "")
                           + ("; to train on, resume with a larger --max-minutes (the whole run's) or "
                              "--max-steps N" if self.step == self.step_at_start else ""))
            return True
        try:
            self.profiler.before(self.step + 1)
            self._step(mine, tokens)
        except Exception as e:
            if not out_of_memory(e):
                raise
            raise TfcliError(
                f"out of memory at step {self.step + 1} (a batch of {int(tokens)} target tokens): lower "
                f"--max-tokens (now {cfg.max_tokens}) or --max-len; {self._resume_hint()}"
            ) from None
        self.pos += len(group)
        self.step += 1
        self.log.advance(self.step)
        profile = self.profiler.after(self.step)
        if profile is not None:
            self.log.print(f"profile of steps {cfg.profile}: {profile}/ops.txt, {profile}/trace.json")
        if self.step % cfg.log_every == 0:
            self._log_train()
        done = bool(cfg.max_steps and self.step >= cfg.max_steps)
        if self.step % cfg.valid_every == 0 or done:
            if self.planned and cfg.max_minutes and not done:
                self._replan_budget()  # before the checkpoint, which then keeps the new plan
                done = self.step >= cfg.max_steps  # no room left for 10 more steps: the last validation
            self.early_stopped = self._validate_and_save()
            self.saved_step = self.step
            done = done or self.early_stopped
        if self.step == (self.step_at_start + self.budget.plan_at) // 2:
            self.budget.start_measuring(self.step)
        if self.step == self.budget.plan_at and not done:
            if self.saved_step != self.step:  # time one validation for the plan
                self.early_stopped = self._validate_and_save()
                self.saved_step = self.step
                done = self.early_stopped
            self._plan_budget()
        return done

    def _plan_budget(self) -> None:
        """Fix max_steps so that training, its validations and the last one fit cfg.max_minutes (`Budget.plan`).
        Until now the learning rate did not depend on the total (warmup), so `--max-steps N` with the planned N
        repeats this run (unless the speed changes and it is planned again: _replan_budget)."""
        cfg = self.cfg
        planned, step_s, one_valid = self.budget.plan(self.step, self.elapsed_at_start, self.step_at_start)
        cfg.max_steps = max(planned, self.step + 1)
        self.planned = True
        self._set_total(cfg.max_steps)
        self.log.print(
            f"time budget {cfg.max_minutes:g} min: {cfg.max_steps} steps planned ({step_s:.3f} s per step, "
            f"{one_valid:.1f} s per validation, measured); --max-steps {cfg.max_steps} without --max-minutes "
            "repeats this schedule while the speed holds (the plan is revised at validations when it changes)"
        )
        self._warn_short()

    def _replan_budget(self) -> None:
        """At a validation of a planned run: the steps that fit again, when the speed has changed
        (`Budget.replan`); the schedule goes on from here to the new end (an anchor), without a jump."""
        cfg = self.cfg
        moved = self.budget.replan(self.step, cfg.max_steps)
        if moved is None:
            return
        planned, step_s, since = moved
        measured = f"{step_s:.3f} s per step since step {since}"
        if planned <= self.step:
            self.log.print(f"time budget {cfg.max_minutes:g} min: no room for 10 more steps at {measured}: the run "
                           f"ends at step {self.step} (of {cfg.max_steps} planned)")
        else:
            self.anchor = (self.step, self._lr(self.step))
            self.log.print(f"time budget {cfg.max_minutes:g} min: {planned} steps planned again at step {self.step} "
                           f"(was {cfg.max_steps}; {measured}); the cosine goes on from lr {self.anchor[1]:.3g} to "
                           "the new end")
        cfg.max_steps = planned
        self._set_total(planned)

    def _mean(self, values: list[float]) -> list[float]:
        """The mean of each value over the processes (the same figures on every process)."""
        return [x / self.dist.world_size for x in distributed.all_reduce_sum(values, self.dist, self.device)]

    def _set_total(self, steps: int) -> None:
        self.total_steps = _total(steps, self.cfg.max_epochs, self.steps_per_epoch)
        self.log.set_total(self.total_steps)
        if self.main:
            atomic_write_text(self.run_dir / "config.yaml", config_to_yaml(self.cfg, self.model_cfg))

    def _step(self, batches: list[Batch], global_tokens: float) -> None:
        """One update from this process's micro-batches; the loss is normalised by the step's global token count."""
        scale = self.dist.world_size / global_tokens  # DDP averages gradients over processes; undo that
        step_acc, tokens = 0.0, 0
        for i, b in enumerate(batches):
            b_dev = b.to(self.device)
            with distributed.no_sync(self.raw if self.cfg.fsdp else self.model, last=i == len(batches) - 1):
                with self.autocast():
                    loss, nll = batch_loss(self.model, b_dev)
                self.scaler.scale(loss * scale).backward()
            step_acc = step_acc + torch.stack([loss.detach().float(), nll.float()])
            tokens += b.tgt_tokens
            self.counts += np.array([b.src_tokens, b.tgt_tokens, b.slots, 0.0])
            if self.device.type == "cuda":
                self.counts[3] += train_flops(self.model_cfg, b.src_tokens, b.tgt_tokens, b.src_pairs, b.tgt_pairs,
                                              b.cross_pairs)
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.clip_norm if self.cfg.clip_norm > 0 else math.inf
        self.grad_norm = distributed.whole(torch.nn.utils.clip_grad_norm_(self.raw.parameters(), clip))
        self.lr = self._lr(self.step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        finite = torch.isfinite(self.grad_norm)  # (the same on every process: DDP's gradients are all-reduced)
        if self.scaler.is_enabled():  # fp16: the scaler skips an update with inf/NaN gradients
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            step_if_finite(self.optimizer, finite)
        self.optimizer.zero_grad(set_to_none=True)
        sound = torch.isfinite(step_acc).all()
        self.skipped += (~finite).long()
        # diverging: a skipped update, but in fp16 only one whose loss was not finite either (a loss scale too large
        # for the gradients is the scaler's to lower)
        bad = (~finite & ~sound if self.scaler.is_enabled() else ~finite).long()
        self.in_row = (self.in_row + bad) * bad
        losses = torch.cat([step_acc, torch.full((1,), float(tokens), device=self.device)])
        self.acc += torch.where(sound, losses, 0.0)  # (the finite losses, and their tokens)

    def _lr(self, step: int) -> float:
        c = self.cfg
        return learning_rate(step, c.schedule, c.lr, c.warmup, self.total_steps, c.min_lr, self.anchor)

    def _continue_schedule(self) -> None:
        """A resumed cosine run whose end moved (a new max_steps, or a new budget to plan) decays from the learning
        rate it had reached to the new end, instead of recomputing the cosine over the new length, which would jump
        back up (a run that had reached its floor would restart near the peak)."""
        cfg = self.cfg
        if self.saved_total is None or cfg.schedule != "cosine" or self.step < cfg.warmup:
            return
        moved = self.total_steps != self.saved_total or (cfg.max_minutes and not cfg.max_steps)
        if moved:
            reached = learning_rate(self.step, cfg.schedule, cfg.lr, cfg.warmup, self.saved_total, cfg.min_lr,
                                    self.anchor)
            self.anchor = (self.step, reached)

    def _warn_short(self) -> None:
        """Most of a run spent warming up is a run that never trains at its peak learning rate."""
        cfg = self.cfg
        if self.total_steps and cfg.warmup and cfg.warmup * 2 > self.total_steps and self.main:
            why = "the time budget leaves" if cfg.max_minutes else "the run has"
            share = (f"warmup takes {cfg.warmup} ({cfg.warmup / self.total_steps:.0%})" if cfg.warmup < self.total_steps
                     else f"warmup ({cfg.warmup}) is longer, so the peak learning rate is never reached")
            self.log.print(f"warning: {why} {self.total_steps} steps, of which {share}: most of the run warms up; "
                           "lower --warmup" + (" or raise --max-minutes" if cfg.max_minutes else " or raise --max-steps"),
                           warning=True)

    def _reset_interval(self) -> None:
        # summed loss, summed nll and their target tokens, of the steps whose loss was finite; the updates skipped
        # (on the device: no sync per step)
        self.acc = torch.zeros(3, device=self.device)
        self.skipped = torch.zeros((), dtype=torch.int64, device=self.device)
        self.counts = np.zeros(4)  # src tokens, tgt tokens, slots, model FLOPs
        self.interval_start = time.perf_counter()
        self.excluded = 0.0  # seconds spent validating/saving within the interval
        self.run_start = getattr(self, "run_start", self.interval_start)

    def _epoch(self) -> int:
        """The epoch in progress, 1-based (at an epoch boundary: the one just finished)."""
        return self.epoch + 1 if self.pos > 0 or self.epoch == 0 else self.epoch

    def _time(self) -> float:
        return self.elapsed + time.perf_counter() - self.run_start

    def _log_train(self) -> None:
        # .tolist(), .item(): the device syncs of a log step (the skip counts are the same on every process)
        local = self.acc.tolist() + self.counts.tolist()
        skipped, in_row = int(self.skipped.item()), int(self.in_row.item())
        loss, nll, kept, src, tgt, slots, flops = distributed.all_reduce_sum(local, self.dist, self.device)
        dt = max(time.perf_counter() - self.interval_start - self.excluded, 1e-9)
        loss, nll = (loss / kept, nll / kept) if kept else (math.nan, math.nan)  # (no finite loss)
        record = {
            "step": self.step, "epoch": self._epoch(), "time": round(self._time(), 3), "split": "train",
            "loss": loss, "nll": nll, "ppl": ppl(nll), "lr": self.lr,
            "src_tokens_per_s": src / dt, "tgt_tokens_per_s": tgt / dt,
            "padding_fraction": 1.0 - (src + tgt) / slots if slots else 0.0,
            "grad_norm": float(self.grad_norm), "skipped": skipped,
        }
        if self.device.type == "cuda":
            if self.peak_flops:
                record["mfu"] = flops / dt / (self.peak_flops * self.dist.world_size)
            record["max_mem_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30  # this rank's peak so far
        self.log.write(record)
        self._reset_interval()
        self._check_diverged(in_row)

    def _check_diverged(self, in_row: int) -> None:
        """End a run whose last DIVERGED_AFTER steps or more were skipped for inf or NaN gradients (`_step`)."""
        if in_row >= DIVERGED_AFTER:
            again = (f"then resume: {self._resume_hint()}" if (self.ckpt_dir / "LATEST").exists()
                     else "then start again (no checkpoint yet)")
            raise TfcliError(f"training diverged: the last {in_row} updates (to step {self.step}) were skipped, their "
                             f"gradients inf or NaN; lower --lr or raise --warmup, {again}")

    # --- validation and checkpoints -------------------------------------------------------------------------------

    def _resume_hint(self) -> str:
        latest = self.ckpt_dir / "LATEST"
        if not latest.exists():
            return "no checkpoint yet"
        return f"{self.ckpt_dir / latest.read_text().strip()} is whole: continue with --resume"

    def _validate_and_save(self) -> bool:
        try:
            return self._validate_and_save_unguarded()
        except Exception as e:
            if not out_of_memory(e):
                raise
        self._save(is_best=False)  # the checkpoint that was due, without its validation
        raise TfcliError(
            f"out of memory while validating at step {self.step}: lower --bleu-max-sentences (now "
            f"{self.cfg.bleu_max_sentences}) or --max-tokens (now {self.cfg.max_tokens}; validation batches are "
            f"as large as training's); {self._resume_hint()}"
        )

    def _validate_and_save_unguarded(self) -> bool:
        """Validate, checkpoint, and decide on early stopping (the same decision on every rank)."""
        self._check_diverged(int(self.in_row.item()))  # (before a validation the checkpoint would not follow)
        t0 = time.perf_counter()
        is_best, stop = False, False
        if self.valid_data:
            metrics = self.validate()
            name = self.cfg.early_stop_metric
            value = metrics[name]
            higher_is_better = name == "bleu"
            if self.best is None or (value > self.best["value"] if higher_is_better else value < self.best["value"]):
                self.best = {"metric": name, "value": value, "step": self.step, "name": step_name(self.step)}
                self.bad_validations = 0
                is_best = True
            else:
                self.bad_validations += 1
            stop = bool(self.cfg.patience and self.bad_validations >= self.cfg.patience)
            self.last_valid = metrics
            self.log.write({"step": self.step, "epoch": self._epoch(), "time": round(self._time(), 3),
                            "split": "valid", **metrics, "best": is_best})
            if stop:
                self.log.print(f"early stopping: valid {name} has not improved for {self.cfg.patience} validations "
                               f"(best {self.best['value']:.4g} at step {self.best['step']})")
        self._save(is_best)
        self.excluded += time.perf_counter() - t0
        self.budget.valid_seconds.append(time.perf_counter() - t0)
        return stop

    def validate(self) -> dict:
        """Valid loss/ppl over the whole valid split (sharded over ranks), and greedy BLEU for translation. A
        multilingual directory's directions are each validated (under "directions"), the metrics their mean."""
        self.raw.eval()
        per = {name: self._validate_split(split, data) for name, (split, data) in self.valid_data.items()}
        self.raw.train()
        if len(per) == 1:
            return next(iter(per.values()))
        mean = {key: sum(m[key] for m in per.values()) / len(per) for key in next(iter(per.values())) if key != "ppl"}
        return {**mean, "ppl": ppl(mean["nll"]), "directions": per}

    def _validate_split(self, split: str, data) -> dict:
        metrics = valid_loss(self.objective, data, self.dist, self.device, self.autocast, even=self.cfg.fsdp)
        if self.prepared.kind == "parallel" and self.cfg.valid_bleu and not self.cfg.fsdp:  # (a translator)
            cfg = self.cfg
            n = len(data) if not cfg.bleu_max_sentences else min(len(data), cfg.bleu_max_sentences)
            with self._decoding_model() as model:
                bleu = greedy_bleu(
                    model, data, self.prepared, split, n, cfg.max_tokens, cfg.max_sentences, self.max_len,
                    self.device, self.autocast, pack=self.precision == "fp32",
                ) if self.main else 0.0
            metrics["bleu"] = distributed.all_reduce_sum([bleu], self.dist, self.device)[0]
        return metrics

    def _decoding_model(self):
        """The model as decoding runs it (a context): a LoRA run's adapters merged into its layers' weights for the
        while (decoding reads the weights), the frozen ones untouched."""
        if not self.adapter:
            return contextlib.nullcontext(self.raw)
        from tfcli.model import lora

        return lora.merged(self.raw)

    def _save(self, is_best: bool) -> None:
        """Checkpoint with the full trainer state (rank 0 writes; every rank contributes its RNG state); none where
        the run has diverged (`_check_diverged`)."""
        in_row = int(self.in_row.item())
        self._check_diverged(in_row)
        rng = torch.get_rng_state()
        torch_states = distributed.gather_tensors(rng, self.dist, self.device)
        cuda_states = []
        if self.device.type == "cuda":
            cuda_states = distributed.gather_tensors(torch.cuda.get_rng_state(self.device), self.dist, self.device)
        weights = moments = None
        if self.cfg.fsdp:  # (every process takes part in gathering the shards)
            weights, moments = distributed.gathered(self.raw, self.optimizer, self.dist)
        if self.main:
            name = step_name(self.step)
            counters = {
                "step": self.step, "epoch": self.epoch, "position": self.pos, "batches_per_step": self.group_size,
                "world_size": self.dist.world_size, "elapsed": self._time(), "best": self.best,
                "bad_validations": self.bad_validations, "last_valid": self.last_valid,
                "total_steps": self.total_steps, "schedule_anchor": list(self.anchor) if self.anchor else None,
                "budget_planned": self.planned, "skipped_in_row": in_row,
            }
            tensors, state = pack_state(self.optimizer, self.scaler, torch_states, cuda_states, counters, moments)
            meta = {
                "model": to_dict(self.model_cfg),
                "train": to_dict(self.cfg),
                "data": {"path": str(Path(self.cfg.data).resolve()), "kind": self.prepared.kind,
                         "vocab": self.prepared.meta.get("vocab"), "joint": bool(self.prepared.meta.get("joint_vocab")),
                         "src_len": self.src_lengths, "src_lang": self.prepared.meta.get("src_lang")},
                "step": self.step,
                "epoch": self._epoch(),
                "metrics": {"valid": self.last_valid, "best": self.best},
                **({"adapter": self.adapter} if self.adapter else {}),
                **self.inherited,
            }
            checkpoint.save(self.ckpt_dir / name, self.raw, meta, self.prepared.tokenizer_files(), tensors, state,
                            weights)
            if is_best:
                atomic_write_text(self.ckpt_dir / "BEST", name + "\n")
            atomic_write_text(self.ckpt_dir / "LATEST", name + "\n")
            # keep the last K checkpoints (K = max(keep_last, average_last)) and the best one; while updates are
            # being skipped, every one (those from before the skips may be what a diverged run goes back to)
            if not in_row:
                keep = max(self.cfg.keep_last, self.cfg.average_last)
                prune(self.ckpt_dir, keep, {self.best["name"]} if self.best else set())
        distributed.barrier(self.dist)

    def _average(self, k: int) -> None:
        """Average the last `k` checkpoints into avg-lastK; a run that wrote fewer averages what it has."""
        from tfcli.train.average import average_checkpoints

        have = len(step_dirs(self.ckpt_dir))
        if have < k:
            self.log.print(f"warning: average_last {k}, but the run has {have} checkpoint(s): "
                           + (f"averaging those into avg-last{have}" if have > 1 else "nothing to average"),
                           warning=True)
            k = have
        if k > 1:
            average_checkpoints(self.run_dir, k, self.ckpt_dir / f"avg-last{k}", overwrite=True)

    def _load_state(self, path: Path) -> None:
        state = restore_state(path, self.optimizer, self.scaler, self.dist.rank, self.device)
        try:
            self.step, self.epoch, self.pos = int(state["step"]), int(state["epoch"]), int(state["position"])
            self.elapsed = float(state["elapsed"])
            self.best, self.bad_validations = state["best"], int(state["bad_validations"])
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"{path}: corrupt or incomplete trainer state ({type(e).__name__}: {e})") from None
        self.last_valid = state.get("last_valid") or {}
        self.old_group_size = state.get("batches_per_step")
        anchor = state.get("schedule_anchor")
        self.anchor = (int(anchor[0]), float(anchor[1])) if anchor else None
        self.saved_total = state.get("total_steps")
        self.planned = bool(state.get("budget_planned"))
        self.in_row = int(state.get("skipped_in_row", 0))

    def close(self) -> None:
        self.profiler.close()
        self.log.close()


def _total(max_steps: int, max_epochs: int, steps_per_epoch: int) -> int:
    """The run's last step by its limits (0: none known yet, e.g. a time budget still to plan)."""
    return min(max_steps or math.inf, max_epochs * steps_per_epoch if max_epochs else math.inf) \
        if max_steps or max_epochs else 0


def out_of_memory(e: BaseException) -> bool:
    """A failed allocation: CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(e, RuntimeError) and ("can't allocate memory" in str(e) or "out of memory" in str(e).lower())


def _graph_room(trainer: Trainer):
    """With --compile, room for one graph per shape bucket: past torch's recompile limit (8 by default) a compiled
    function falls back to eager for every new shape. Set for the run only."""
    if not trainer.cfg.compile or trainer.cfg.compile_shapes == "dynamic":
        return contextlib.nullcontext()
    import torch._dynamo

    buckets = trainer.max_len // trainer.pad_multiple + 2  # train and valid shapes, the max_len bucket included
    limit = max(torch._dynamo.config.cache_size_limit, buckets)
    return torch._dynamo.config.patch(cache_size_limit=limit)


def train(cfg: TrainConfig, model_overrides: dict | None = None, saved: dict | None = None) -> TrainResult:
    """Train as configured; rank 0 writes RUN/{config.yaml, metrics.jsonl, checkpoints/}."""
    trainer = None
    # process-wide settings the trainer changes (threads; TF32 matmuls on a GPU), restored for the caller
    threads = torch.get_num_threads()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    # one process writes a run directory at a time (under torchrun, rank 0 holds the lock for all)
    lock = run_lock(cfg.out, "train") if cfg.out and int(os.environ.get("RANK", "0")) == 0 else contextlib.nullcontext()
    try:
        with lock:
            trainer = Trainer(cfg, model_overrides, saved)
            with _graph_room(trainer):
                return trainer.fit()
    finally:
        if trainer is not None:
            trainer.close()
        distributed.teardown()
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def run(config_file: str | Path | None, flags: dict, sets: list[str] | None = None) -> TrainResult:
    """`tfcli train`: resolve the config (on --resume, on top of the run's saved one) and train."""
    given, model_overrides = train_settings(config_file, flags, sets)
    cfg = resolve_train_config(given)
    saved = None
    if cfg.resume:
        run_dir = Path(cfg.out)
        if not (run_dir / CHECKPOINTS / "LATEST").exists() and (run_dir / "config.yaml").is_file():
            return _restart(run_dir, given, model_overrides)
        if not (run_dir / CHECKPOINTS / "LATEST").exists() and _holds_no_run(run_dir):
            print(f"{run_dir}: no run there yet (nothing to resume); starting it", file=sys.stderr)
            return train(resolve_train_config({k: v for k, v in given.items() if k != "resume"}), model_overrides)
        if not (run_dir / CHECKPOINTS / "LATEST").exists():
            raise CheckpointError(f"{run_dir}: holds files but no run (no config.yaml, no {CHECKPOINTS}/LATEST): "
                                  "nothing to resume; choose another --out")
        saved = checkpoint_meta.read_meta(resume_point(cfg.out))
        cfg = resolve_train_config(given, saved)
    return train(cfg, model_overrides, saved)


def _holds_no_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds nothing of a run: it does not exist, or holds only what a run killed before its
    config makes (an empty checkpoints folder, temporary files of writes that never finished). Job scripts on
    preemptible machines pass --resume on every start, the first included."""
    def hidden_only(d: Path) -> bool:
        return all(p.name.startswith(".") for p in d.iterdir())

    if not run_dir.exists():
        return True
    if not run_dir.is_dir():
        return False
    return all(p.name.startswith(".") or (p.name == CHECKPOINTS and p.is_dir() and hidden_only(p))
               for p in run_dir.iterdir())


def _same_settings(run_dir: Path, started: dict, given: dict) -> None:
    """--resume of a run stopped before its first checkpoint restarts it only with the settings it started with
    (its limits may change, as on any resume): a setting given otherwise is refused, naming it."""
    def same(key, a, b) -> bool:
        if key in ("data", "out", "init_from") and a and b:
            return Path(str(a)).resolve() == Path(str(b)).resolve()
        try:
            return from_dict(TrainConfig, {key: a}, "train") == from_dict(TrainConfig, {key: b}, "train")
        except ConfigError:
            return a == b

    changed = [k for k, v in given.items() if k not in ("resume", "max_steps", "max_minutes", "max_epochs")
               and k in started and not same(k, v, started[k])]
    if changed:
        raise CheckpointError(f"{run_dir}: --resume of a run that started with other settings ("
                              + ", ".join(f"{k}: {started[k]} -> {given[k]}" for k in changed)
                              + "); give its own, or choose another --out")


def _restart(run_dir: Path, given: dict, overrides: dict) -> TrainResult:
    """--resume of a run stopped before its first checkpoint: nothing to continue, so the run starts again from
    step 0 with the config it had saved (RUN/config.yaml), as the recipes' re-runs expect."""
    import yaml

    try:
        started = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        base = {"train": dict(started["train"]), "model": dict(started["model"])}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise CheckpointError(f"{run_dir}/config.yaml: unreadable ({e}); start without --resume") from None
    base["train"]["resume"] = False
    _same_settings(run_dir, base["train"], given)
    cfg = resolve_train_config({k: v for k, v in given.items() if k != "resume"}, base)
    model = {k: v for k, v in base["model"].items() if k not in ("kind", "src_vocab_size", "tgt_vocab_size")}
    print(f"{run_dir}: stopped before its first checkpoint; starting it again from step 0 with its saved config",
          file=sys.stderr)
    return train(cfg, {**model, **overrides})
