"""`tfcli train`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from tfcli.cli.common import (
    config_defaults,
    Quiet, _set_level, app, check_choice, choices_of, fail, refuse_unused, run,
)
from tfcli.errors import EXIT_INTERRUPTED, EXIT_USAGE
from tfcli.train.config import TrainConfig


_OPT, _BATCH, _VAL, _HW = "Optimisation", "Batching", "Validation, logging, checkpoints", "Hardware"
_ADAPT = "Fine-tuning (with --init-from)"


@app.command()
@config_defaults(TrainConfig)
def train(
    ctx: typer.Context,
    data: Optional[str] = typer.Argument(
        None, metavar="DATA", show_default=False, help="Prepared directory (tfcli prepare); parallel for a "
        "translation model, monolingual for a language model."
    ),
    out: Optional[str] = typer.Option(None, "--out", "--output", "-o", metavar="RUN", help="Run directory to write."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", metavar="FILE", help="YAML/TOML file with `train:` and `model:` sections."
    ),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", metavar="SECTION.KEY=VALUE", show_default=False,
        help="Set any option, e.g. --set model.dropout=0.3 --set train.warmup=800 (repeat).",
    ),
    arch: Optional[str] = typer.Option(
        None, "--arch", "-a", help="Architecture preset: toy, small, base, big (translation); lm-toy, lm-cpu, "
        "baby-gpt, gpt2-small (language model). Their shapes: docs/training.md."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in RUN from its latest checkpoint."),
    init_from: Optional[str] = typer.Option(
        None, "--init-from", metavar="CKPT", help="Fine-tune: start from this checkpoint's weights and architecture "
        "(a fresh optimizer and schedule). DATA must use its tokenizer: tfcli prepare --tokenizer-from CKPT."
    ),
    lora_rank: Optional[int] = typer.Option(
        None, "--lora-rank", metavar="R", rich_help_panel=_ADAPT, help="Train rank-R LoRA adapters on the frozen "
        "model instead of its weights; checkpoints hold the adapters alone (tfcli export --to peft), decoding merges "
        "them (0: off)."
    ),
    lora_alpha: Optional[float] = typer.Option(
        None, "--lora-alpha", rich_help_panel=_ADAPT, help="The adapters' output is scaled by alpha / rank "
        "\\[default: 16]."
    ),
    lora_dropout: Optional[float] = typer.Option(
        None, "--lora-dropout", rich_help_panel=_ADAPT, help="Dropout on the adapters' input \\[default: 0]."
    ),
    lora_targets: Optional[str] = typer.Option(
        None, "--lora-targets", metavar="LAYERS", rich_help_panel=_ADAPT, help="Comma-separated layers to adapt: "
        "qkv, self_out, cross_q, cross_kv, cross_out, w1, w2, w3 \\[default: all of them]."
    ),
    freeze: Optional[str] = typer.Option(
        None, "--freeze", metavar="PARTS", rich_help_panel=_ADAPT, help="Full fine-tuning with these parts left as "
        "they are, comma-separated: embeddings, encoder, decoder, or patterns of parameter names "
        "('decoder.layers.0.*')."
    ),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", rich_help_panel=_OPT, help="Updates (0: no limit)."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", rich_help_panel=_OPT, help="Epochs (0: no limit)."),
    max_minutes: Optional[float] = typer.Option(
        None, "--max-minutes", rich_help_panel=_OPT, help="Wall-clock budget, validations included (0: none). Without "
        "--max-steps the step count is planned at the end of warmup from the measured speed (logged; --max-steps N "
        "repeats it)."
    ),
    lr: Optional[float] = typer.Option(None, "--lr", rich_help_panel=_OPT, help="Peak learning rate."),
    schedule: Optional[str] = typer.Option(
        None, "--schedule", rich_help_panel=_OPT, help="inverse_sqrt (the 2017 paper's), cosine or constant, all with "
        "linear warmup."
    ),
    warmup: Optional[int] = typer.Option(None, "--warmup", rich_help_panel=_OPT, help="Warmup steps."),
    label_smoothing: Optional[float] = typer.Option(
        None, "--label-smoothing", rich_help_panel=_OPT, help="Label smoothing epsilon of the loss."
    ),
    weight_decay: Optional[float] = typer.Option(
        None, "--weight-decay", rich_help_panel=_OPT, help="AdamW decay of weight matrices."
    ),
    clip_norm: Optional[float] = typer.Option(
        None, "--clip-norm", rich_help_panel=_OPT, help="Clip gradients to this global norm (0: off)."
    ),
    grad_accum: Optional[int] = typer.Option(
        None, "--grad-accum", rich_help_panel=_OPT, help="Micro-batches per update."
    ),
    seed: Optional[int] = typer.Option(None, "--seed", rich_help_panel=_OPT, help="Random seed: initial weights, data order, dropout."),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", rich_help_panel=_BATCH, help="Padded tokens per batch per process."
    ),
    max_sentences: Optional[int] = typer.Option(
        None, "--max-sentences", rich_help_panel=_BATCH, help="Sentences per batch, at most (0: no limit)."
    ),
    max_len: Optional[int] = typer.Option(
        None, "--max-len", rich_help_panel=_BATCH,
        help="Translation: truncate longer sentences; LM: block length \\[default: the model's max_len].",
    ),
    bpe_dropout: Optional[float] = typer.Option(
        None, "--bpe-dropout", metavar="P", rich_help_panel=_BATCH,
        help="BPE-dropout for translation training: each epoch re-cuts the training pairs into subwords, skipping "
        "each merge with probability P (0.1 is usual; a bpe tokenizer; valid, test and inference unchanged).",
    ),
    log_every: Optional[int] = typer.Option(None, "--log-every", rich_help_panel=_VAL, help="Log the training loss every N steps."),
    valid_every: Optional[int] = typer.Option(
        None, "--valid-every", rich_help_panel=_VAL, help="Validate and checkpoint every N steps."
    ),
    valid_bleu: Optional[bool] = typer.Option(
        None, "--valid-bleu/--no-valid-bleu", rich_help_panel=_VAL, help="Greedy BLEU on the valid set."
    ),
    early_stop: Optional[str] = typer.Option(
        None, "--early-stop", rich_help_panel=_VAL, help="Metric for early stopping and BEST: loss, ppl or bleu "
        "\\[default: loss]."
    ),
    patience: Optional[int] = typer.Option(
        None, "--patience", rich_help_panel=_VAL, help="Validations without improvement before stopping (0: never)."
    ),
    keep_last: Optional[int] = typer.Option(
        None, "--keep-last", rich_help_panel=_VAL, help="Checkpoints kept besides the best."
    ),
    average_last: Optional[int] = typer.Option(
        None, "--average-last", rich_help_panel=_VAL, help="At the end, average the last K checkpoints into "
        "RUN/checkpoints/avg-lastK."
    ),
    tensorboard: Optional[bool] = typer.Option(
        None, "--tensorboard/--no-tensorboard", rich_help_panel=_VAL,
        help="Also write TensorBoard events to RUN/tensorboard (pip install 'tfcli\\[tensorboard]').",
    ),
    device: Optional[str] = typer.Option(None, "--device", rich_help_panel=_HW, help="auto, cpu, cuda, cuda:N."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", rich_help_panel=_HW, help="auto, native-bf16, fp32, bf16 or fp16 (GPU, with "
        "loss scaling) \\[default: auto = bf16 on a GPU that has it, else fp32; native-bf16: also bf16 on a CPU with "
        "native bf16 products: AMX or AVX-512 BF16]."
    ),
    compile_: Optional[bool] = typer.Option(None, "--compile/--no-compile", rich_help_panel=_HW, help="torch.compile."),
    activation_checkpointing: Optional[bool] = typer.Option(
        None, "--activation-checkpointing/--no-activation-checkpointing", rich_help_panel=_HW,
        help="Keep each layer's input only and recompute its activations in the backward: much less memory for "
        "about a third more compute.",
    ),
    fsdp: Optional[bool] = typer.Option(
        None, "--fsdp/--no-fsdp", rich_help_panel=_HW,
        help="Under torchrun, shard the parameters, gradients and optimizer state over the processes (FSDP), for a "
        "model one device cannot hold \\[default: off: DDP, a whole copy in each process].",
    ),
    pad_multiple: Optional[int] = typer.Option(
        None, "--pad-multiple", metavar="N", rich_help_panel=_HW,
        help="Pad batch lengths to a multiple of N (and rows to fill max-tokens): few shapes, one compiled graph "
        "each (0: 8 with --compile, else no extra padding).",
    ),
    compile_shapes: Optional[str] = typer.Option(
        None, "--compile-shapes", metavar="static|dynamic", rich_help_panel=_HW,
        help="With --compile: one static graph per shape bucket (fastest kernels), or dynamic-shape graphs the "
        "buckets share (fewer compilations, where the buckets are many) \\[default: static].",
    ),
    threads: Optional[int] = typer.Option(None, "--threads", rich_help_panel=_HW, help="CPU threads for torch (0: torch's own choice)."),
    profile: Optional[str] = typer.Option(
        None, "--profile", metavar="A-B", rich_help_panel=_HW, help="Run steps A to B under torch.profiler: "
        "RUN/profile/ops.txt (ops by device time) and trace.json (Chrome trace)."
    ),
    quiet: Quiet = False,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", callback=_set_level("verbose"), is_eager=True,
        help="Also print the whole resolved config at the start (it is always in RUN/config.yaml and RUN/train.log).",
    ),
):
    """Train an encoder-decoder (translation) or decoder-only (language model) Transformer.

    tfcli train prep/ -o run/ --arch small --warmup 4000
    tfcli train prep/ -o run/ -c train.yaml --set model.dropout=0.3
    tfcli train -o run/ --resume --max-steps 50000      continue exactly
    tfcli train prep/ -o tuned/ --init-from run/ --lr 1e-4      fine-tune
    tfcli train prep/ -o lora/ --init-from imported/ --lora-rank 16      adapters (LoRA)
    torchrun --nproc_per_node=4 $(which tfcli) train prep/ -o run/

    Writes RUN/config.yaml (the resolved config), RUN/metrics.jsonl (one JSON line per log step and per
    validation) and RUN/checkpoints/step-N/ with BEST and LATEST pointers; `tfcli translate -m RUN` uses BEST.
    Ctrl-C or SIGTERM finishes the step, saves a checkpoint and exits with status 130.
    Prints the best (else the last) checkpoint's path on stdout. "tok/s" counts non-padding target tokens.
    """
    from tfcli.runtime import keep_freed_memory
    from tfcli.model.config import PRESETS, RENAMED, renamed_message
    from tfcli.train.trainer import run as run_training

    if arch in RENAMED:
        fail(renamed_message(arch), EXIT_USAGE)
    check_choice("--arch", arch, list(PRESETS))
    if init_from:
        refuse_unused(ctx, ["arch"], "is not used with --init-from: the architecture is the checkpoint's")
    for flag, value, name in (("--schedule", schedule, "schedule"), ("--dtype", dtype, "dtype"),
                              ("--early-stop", early_stop, "early_stop_metric"),
                              ("--compile-shapes", compile_shapes, "compile_shapes")):
        check_choice(flag, value, choices_of(TrainConfig, name))
    flags = dict(
        data=data, out=out, arch=arch, resume=resume or None, init_from=init_from, max_steps=max_steps, max_epochs=max_epochs,
        max_minutes=max_minutes, lr=lr, schedule=schedule, warmup=warmup, label_smoothing=label_smoothing,
        weight_decay=weight_decay, clip_norm=clip_norm, grad_accum=grad_accum, seed=seed, max_tokens=max_tokens, max_sentences=max_sentences,
        max_len=max_len, bpe_dropout=bpe_dropout, log_every=log_every, valid_every=valid_every, valid_bleu=valid_bleu,
        early_stop_metric=early_stop, patience=patience, keep_last=keep_last, average_last=average_last,
        tensorboard=tensorboard,
        device=device, dtype=dtype, compile=compile_, pad_multiple=pad_multiple, compile_shapes=compile_shapes,
        threads=threads, profile=profile, lora_rank=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
        lora_targets=_names(lora_targets), freeze=_names(freeze), activation_checkpointing=activation_checkpointing, fsdp=fsdp,
    )
    keep_freed_memory()  # the step's logits and their gradient, reused instead of faulted in afresh each step
    result = run(run_training, config, flags, sets)
    if result.interrupted:
        print(f"interrupted at step {result.step}; saved {result.checkpoint}; continue with: tfcli train -o "
              f"{result.run_dir} --resume", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED)
    print(result.best or result.checkpoint)


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]
