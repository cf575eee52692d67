"""`tfcli export`, `tfcli import` and `tfcli quantize`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tfcli.cli.common import (
    Quiet, app, check_choice, run,
)


@app.command("export")
def export_(
    model: str = typer.Argument(..., metavar="RUN_OR_CKPT", show_default=False, help="Checkpoint or run directory."),
    to: str = typer.Option(..., "--to", metavar="TARGET", show_default=False,
                           help="ctranslate2 (Translator/Generator), hf (transformers) or peft (a LoRA run's "
                           "adapters)."),
    output: Path = typer.Option(..., "--output", "-o", metavar="DIR", show_default=False,
                                help="New model directory (must not exist)."),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", metavar="TYPE", show_default=False,
        help="ctranslate2 only, its weights' type (CTranslate2's quantization): int8, int8_float32, int8_float16, int8_bfloat16, int16, float16 or bfloat16 "
        "\\[default: float32].",
    ),
    quiet: Quiet = False,
):
    """Export a model to CTranslate2 or Hugging Face transformers, computing the same function.

    tfcli export run/ --to ctranslate2 -o model-ct2 [--dtype int8]
    tfcli export run/ --to hf -o model-hf
    tfcli export lora-run/ --to peft -o adapter      (peft.PeftModel.from_pretrained(base_hf, "adapter"))

    ctranslate2: ctranslate2.Translator(DIR), or ctranslate2.Generator(DIR) for a language model, with the tokenizer
    files copied beside it; every tfcli architecture is supported. hf: AutoModelForSeq2SeqLM /
    AutoModelForCausalLM and AutoTokenizer load it, as MarianMT (post-norm translation models), Pegasus (pre-norm,
    shared embeddings) or GPT-2 (language models with learned positions); other options are refused, naming the
    option. A LoRA run (train --lora-rank) exports merged into its base model, or with --to peft its adapters
    alone, for the hf export of its base. The directory is written whole or not at all.
    """
    from tfcli.interop.ct2 import QUANTIZATIONS
    from tfcli.interop.exporter import TARGETS, export

    check_choice("--to", to, TARGETS)
    check_choice("--dtype", dtype, QUANTIZATIONS)
    info = run(export, model, to, output, dtype)
    print(f"{info['out']}: {info['class']} ({info['to']}{', ' + info['quantization'] if info['quantization'] else ''})")


@app.command("import")
def import_(
    source: str = typer.Argument(..., metavar="HF_DIR", show_default=False,
                                 help="A transformers model directory (save_pretrained), or a hub name when online."),
    output: Path = typer.Option(..., "--output", "-o", metavar="CKPT", show_default=False,
                                help="New tfcli checkpoint directory."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace --output if it exists."),
    quiet: Quiet = False,
):
    """Import a Hugging Face Marian, Pegasus or GPT-2 model as a tfcli checkpoint.

    tfcli import opus-mt-de-en/ -o ckpt
    tfcli translate -m ckpt test.de

    Weights are read from safetensors only (never a pickle), the tokenizer from tokenizer.json. The vocabulary is
    reordered so that tfcli's special tokens have their fixed ids; the model computes the same distribution.
    """
    from tfcli.interop.hf_import import import_model

    info = run(import_model, source, output, force)
    vocab = ", ".join(f"{side} {n}" for side, n in info["vocab"].items())
    print(f"{output}: {info['arch']} -> tfcli {info['kind']}, {info['parameters'] / 1e6:.2f}M parameters, vocabulary {vocab}")


@app.command("quantize")
def quantize(
    model: str = typer.Argument(..., metavar="RUN_OR_CKPT", show_default=False, help="Checkpoint or run directory."),
    dtype: str = typer.Option(
        "int8", "--dtype", metavar="DTYPE",
        help="int8: every linear layer quantised; fp32: the decoder's linear layers and the output layer in the row "
        "kernel's layout (no quantisation).",
    ),
    quiet: Quiet = False,
):
    """Store a checkpoint's linear layers as `--dtype DTYPE` decodes them on the CPU, beside its weights.

    tfcli quantize run/                  (the run's best checkpoint; int8)
    tfcli translate -m run/ --dtype int8 test.de
    tfcli quantize run/ --dtype fp32     (fp32 decoding on the row kernel: its layout)

    Decoding then maps these instead of making them at every start (quantising the weights for int8, reordering
    them for fp32): the same outputs, a faster start, and pages that every process decoding the model shares
    (docs/performance.md). As CTranslate2's models, converted once. The file (model.int8.safetensors,
    model.fp32.safetensors) records a fingerprint of the weights it was made from: where they change, it is
    ignored with a warning until quantized again. The checkpoint's own weights stay: training, export and every
    other dtype read them. fp32 stores the decoder's and the output layer's weights a second time (1.3 GB for an
    M2M-100 418M). Written atomically.
    """
    from tfcli.generate.loader import quantize as store_layers

    check_choice("--dtype", dtype, ("int8", "fp32"))
    path = run(store_layers, model, dtype)
    print(f"{path}: {path.stat().st_size / 2**20:,.0f} MB")
