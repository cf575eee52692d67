"""`tfcli generate` (`lm-generate`, its earlier name, still works)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tfcli.cli.common import (
    config_defaults,
    Checkpoint, Device, Dtype, EncodingErrors, OutputFile, Quiet, ShowProgress, Threads, _RUN, _SAMPLE, _config_file,
    app, check_choice, choices_of, refuse_unused, run,
)
from tfcli.generate.config import GenerateConfig


@config_defaults(GenerateConfig)
def generate(
    ctx: typer.Context,
    prompts: Optional[List[str]] = typer.Argument(
        None, metavar="PROMPT", show_default=False,
        help="Prompts to continue. None: one per line of --input, or of stdin when piped; else generate from scratch.",
    ),
    model: Checkpoint = ...,
    input_file: Optional[str] = typer.Option(
        None, "--input", "-i", metavar="FILE", help="Read prompts from FILE, one a line ('-': stdin)."
    ),
    output: OutputFile = None,
    config: Optional[Path] = _config_file("generate"),
    max_new_tokens: Optional[int] = typer.Option(
        None, "--max-new-tokens", "-n", rich_help_panel=_SAMPLE,
        help="Tokens to generate, at most.",
    ),
    min_new_tokens: Optional[int] = typer.Option(
        None, "--min-new-tokens", rich_help_panel=_SAMPLE,
        help="No </s> before this many new tokens.",
    ),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", rich_help_panel=_SAMPLE, help="Never stop at </s>: generate --max-new-tokens tokens."
    ),
    greedy: bool = typer.Option(False, "--greedy", rich_help_panel=_SAMPLE, help="Always take the most likely token."),
    sampling: bool = typer.Option(
        False, "--sampling", rich_help_panel=_SAMPLE,
        help="Draw each token (the default; as translate --sampling): temperature, top-k, top-p, seeded by --seed.",
    ),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", "-t", rich_help_panel=_SAMPLE,
        help="Divide logits by T before sampling.",
    ),
    top_k: Optional[int] = typer.Option(
        None, "--top-k", rich_help_panel=_SAMPLE,
        help="Sample among the K most likely tokens (0: all).",
    ),
    top_p: Optional[float] = typer.Option(
        None, "--top-p", rich_help_panel=_SAMPLE,
        help="Nucleus: sample among the most likely tokens holding probability P.",
    ),
    repetition_penalty: Optional[float] = typer.Option(
        None, "--repetition-penalty", rich_help_panel=_SAMPLE,
        help="CTRL penalty on tokens already in the text (1: none; 1.2 is common).",
    ),
    no_repeat_ngram_size: Optional[int] = typer.Option(
        None, "--no-repeat-ngram-size", metavar="N", rich_help_panel=_SAMPLE,
        help="No N-gram twice in a text, its prompt included (0: no rule).",
    ),
    seed: Optional[int] = typer.Option(
        None, "--seed", rich_help_panel=_SAMPLE, help="Random seed: each prompt draws from numbers keyed by the seed "
        "and its index in the input, so the same seed, prompt, index and options give the same text at any "
        "--batch-size (as translate --sampling's; `seed: null` in a config file: a random one)."
    ),
    nbest: Optional[int] = typer.Option(
        None, "--nbest", "-N", rich_help_panel=_SAMPLE, help="Outputs per prompt, each drawn on its own numbers "
        "(--num-samples: its earlier name)."
    ),
    stop: Optional[List[str]] = typer.Option(
        None, "--stop", rich_help_panel=_SAMPLE, help="Stop when this string appears (not printed); repeatable."
    ),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", rich_help_panel=_RUN, help="Samples generated together."
    ),
    check_every: Optional[int] = typer.Option(
        None, "--check-every", rich_help_panel=_RUN,
        help="Read the new tokens from the device every N steps, to stop and let finished samples leave (0: every "
        "step on the CPU, every 8 on a GPU; every step with --stop or when streaming). Outputs do not depend on it.",
    ),
    jsonl: bool = typer.Option(
        False, "--jsonl", help="One JSON object a sample, for text that holds newlines (format below)."
    ),
    chat: bool = typer.Option(
        False, "--chat", help="Each prompt is a user's message, written with the model's own chat template (an "
        "imported chat model's); a prompt line that is a JSON object with a \"messages\" list is a whole "
        "conversation. The reply alone is written; it ends at any of the model's end tokens."
    ),
    system: Optional[str] = typer.Option(
        None, "--system", metavar="TEXT", help="With --chat: the system message, said before each conversation."
    ),
    encoding_errors: EncodingErrors = None,
    device: Device = None,
    dtype: Dtype = None,
    threads: Threads = None,
    progress: ShowProgress = None,
    quiet: Quiet = False,
):
    """Generate text with a language model: greedy, or sampling with temperature, top-k, top-p.

    tfcli generate -m run/ "ROMEO:" --max-new-tokens 200 --top-p 0.9 --seed 7
    tfcli generate -m run/ -i prompts.txt --nbest 3 > samples.txt
    echo "The meaning of" | tfcli generate -m run/ --greedy --stop "."
    tfcli generate -m run/ -i prompts.txt -N 4 --seed 1 --jsonl > samples.jsonl
    tfcli generate -m qwen/ --chat --system "Answer briefly." "What is RoPE?"

    Each sample is written as its prompt followed by the generated text, then a newline, in prompt order (samples
    of one prompt together). Generation stops at </s> (a warning says so when it comes before --max-new-tokens;
    --min-new-tokens and --ignore-eos hold it back), at a --stop string (cut off), or after --max-new-tokens.
    Past the model's context (max_len tokens, prompt included) it goes on from the last max_len / 2 tokens.
    A single prompt with a single sample streams to stdout as tokens are made.
    With --jsonl each sample is one line of JSON instead (newlines inside the text stay escaped):
        {"index": PROMPT_INDEX, "sample": SAMPLE_INDEX, "prompt": "...", "continuation": "..."}
    both indices 0-based, in the same order.
    """
    from tfcli.runtime import tune_process
    from tfcli.generate.config import generate_config
    from tfcli.generate.lm import lm_generate as run_generate

    if greedy:
        refuse_unused(ctx, ["temperature", "top_k", "top_p", "seed", "sampling"], "is not used with --greedy (no sampling)")
    if ignore_eos:
        refuse_unused(ctx, ["min_new_tokens"], "is not used with --ignore-eos (</s> never ends the text)")
    check_choice("--dtype", dtype, choices_of(GenerateConfig, "dtype"))
    check_choice("--encoding-errors", encoding_errors, choices_of(GenerateConfig, "encoding_errors"))

    cfg = run(
        generate_config, config,
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, ignore_eos=ignore_eos or None,
        greedy=True if greedy else False if sampling else None, temperature=temperature, top_k=top_k, top_p=top_p,
        repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size, seed=seed, nbest=nbest, stop=stop or None,
        batch_size=batch_size, check_every=check_every, encoding_errors=encoding_errors, device=device, dtype=dtype, threads=threads, jsonl=jsonl or None,
        chat=chat or None, system=system,
    )
    run(tune_process, cfg.device, cfg.threads)
    run(run_generate, model, prompts or [], input_file, output, cfg, progress)


app.command("generate")(generate)
app.command("lm-generate", hidden=True)(generate)  # (its earlier name)
