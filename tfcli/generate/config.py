"""The settings of `tfcli translate` and `tfcli lm-generate` (the `translate:` and `generate:` sections of a config
file, and the Python API's options): each key and its default in one place, importable without torch, so that the
command line's help can show the defaults."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from tfcli.config import from_dict, load_config_file, override
from tfcli.errors import ConfigError


@dataclass
class TranslateConfig:
    """Decoding, batching and device settings (the `translate:` section of a config file)."""

    ALIASES: ClassVar[dict[str, str]] = {"topk": "top_k", "topp": "top_p"}  # old key spellings that still work

    beam_size: int = 5  # 1 = greedy decoding; not used with sampling
    len_penalty: float = 0.6  # GNMT alpha: hypotheses ranked by sum(log p) / ((5 + |Y|) / 6)^alpha
    max_len_a: float = 1.5  # at most a * source length + b output tokens
    max_len_b: int = 10
    min_len: int = 0  # no </s> before this many output tokens
    no_repeat_ngram_size: int = 0  # no n-gram of this size twice in an output (0: no rule)
    # CTRL's penalty on the tokens already output (1: none): on the logits in greedy search and sampling, on the
    # log-probs in beam search (transformers' convention)
    repetition_penalty: float = 1.0
    nbest: Optional[int] = None  # print the N best per input as "i<TAB>score<TAB>hypothesis"
    scores: bool = False  # add the per-token log-probs (implies the nbest format)
    # one JSON object a translation: {"index", "text", "score"}, with --nbest "rank", with --scores "token_scores",
    # with --alignment "alignment" ([source word, target word] pairs), where the line has constraints (its own, a
    # glossary's) "constraints" ([{"phrase", "held"}])
    jsonl: bool = False
    raw: bool = False  # print subword tokens instead of detokenised text
    # sampling (back-translation): each line drawn with random numbers keyed by (seed, its index in the input)
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0  # sample among the k most likely tokens; 0: all
    top_p: float = 1.0  # nucleus: the most likely tokens holding probability p; 1: all
    seed: int = 1
    alignment: bool = False  # add word alignments (Pharaoh "i-j") from the cross-attention, after a tab
    alignment_layer: int = 0  # the decoder layer (1-based) whose cross-attention aligns; 0: the penultimate
    # a multilingual model: the language to translate into (its tag >>xx<< goes first in every source line; an
    # imported M2M-100/NLLB model's token is forced first in every output)
    tgt_lang: Optional[str] = None
    # text: a line is a sentence (or a document); jsonl: each line a JSON object {"text": ..., "tgt_lang": ...,
    # "prefix": ...}, all but the text optional; xml, html: each line a fragment with inline markup, the tags put back
    # by word alignment (tfcli/formats/markup.py); html-page, markdown, srt, vtt, po, xliff, json: a whole file in
    # that format, its structure kept (tfcli/formats/files.py); auto: a file by its extension (text for stdin)
    input_format: Literal["auto", "text", "jsonl", "xml", "html", "html-page", "markdown", "srt", "vtt", "po",
                          "xliff", "json"] = "auto"
    # placeholders (printf, %(name)s, {name}, {{var}}, ICU, BBCode, URLs, e-mail addresses) copied untouched:
    # auto: in every format but text and jsonl; always; never
    placeholders: Literal["auto", "always", "never"] = "auto"
    protect: list[str] = field(default_factory=list)  # regular expressions of the user's own text to copy untouched
    keep_tags: list[str] = field(default_factory=list)  # elements (xml, html) copied whole, content untranslated
    overwrite: bool = False  # po, xliff: translate entries that have a translation already (default: keep it)
    # documents: a line is translated sentence by sentence, the translations joined on its one output line: auto (a
    # line longer than 99% of the model's training sources, or than its max_len; every line for an imported model,
    # trained on sentence pairs), always, or never; whatever this says, a sentence longer than max_len is
    # translated in windows, never cut
    split_sentences: Literal["auto", "always", "never"] = "auto"
    # the input's language, for the sentence splitter's rules (default: generic); an imported M2M-100/NLLB model
    # needs it (its token goes first in every source line)
    src_lang: Optional[str] = None
    # glossary files (TSV or CSV: source term, target term; tfcli/generate/glossary.py): each source term found in a
    # line makes its target term one of the line's constraints
    glossary: list[str] = field(default_factory=list)
    # a decoder-only model's prompt (tfcli/generate/prompting.py): a string or a file with {text} (and {src_lang},
    # {tgt_lang}); null: the model's chat template around a translation instruction
    prompt_template: Optional[str] = None
    batch_size: int = 64  # sentences per batch, at most
    max_tokens: int = 4096  # padded source tokens per batch, at most
    buffer_size: int = 10000  # lines read ahead and sorted by length
    # the search's host reads its state from the device every N steps (0: every step on the CPU, 8 on a GPU)
    check_every: int = 0
    part_lines: int = 10000  # lines per part when several processes share a file, or with --resume (shards.py)
    # input that is not UTF-8: strict (stop, naming file, line and column) or replace (U+FFFD for each bad byte)
    encoding_errors: Literal["strict", "replace"] = "strict"
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    dtype: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"  # int8: the CPU, every linear layer in int8
    threads: Optional[int] = None  # torch CPU threads (default: torch's choice)

    def validate(self) -> None:
        if self.beam_size < 1:
            raise ConfigError("translate: --beam-size must be at least 1")
        if self.nbest is not None and not 1 <= self.nbest <= self.beam_size:
            raise ConfigError(f"translate: --nbest must be between 1 and the beam size ({self.beam_size})")
        if self.check_every < 0:
            raise ConfigError("translate: --check-every must not be negative (0: the device's default)")
        if self.batch_size < 1 or self.max_tokens < 1 or self.buffer_size < 1 or self.part_lines < 1:
            raise ConfigError("translate: --batch-size, --max-tokens, --buffer-size and --part-lines must be positive")
        if self.max_len_a < 0 or self.min_len < 0 or self.no_repeat_ngram_size < 0:
            raise ConfigError("translate: --max-len-a, --min-len and --no-repeat-ngram-size must not be negative")
        if self.repetition_penalty <= 0:
            raise ConfigError("translate: --repetition-penalty must be positive (1: none)")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("translate: --threads must be positive")
        if self.temperature <= 0 or self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ConfigError("translate: --temperature must be positive, --top-k >= 0 and --top-p in (0, 1]")
        if self.sampling and (self.nbest or 1) > 1:
            raise ConfigError("translate: --sampling draws one translation a line: no --nbest above 1")
        if self.alignment_layer < 0:
            raise ConfigError("translate: --alignment-layer must be 1 or more (0: the penultimate layer)")
        if self.raw and self.input_format not in ("auto", "text", "jsonl"):
            raise ConfigError(f"translate: --raw prints subword tokens; --input-format {self.input_format} needs text")
        if self.glossary and self.sampling:
            raise ConfigError("translate: --glossary makes constraints, which need beam search, not --sampling")

    @property
    def tabular(self) -> bool:
        return self.nbest is not None or self.scores


@dataclass
class GenerateConfig:
    """Sampling, stopping, batching and device settings (the `generate:` section of a config file)."""

    ALIASES: ClassVar[dict[str, str]] = {"num_samples": "nbest"}  # old key spellings that still work

    max_new_tokens: int = 100
    min_new_tokens: int = 0  # no </s> before this many new tokens
    ignore_eos: bool = False  # never stop at </s>: always generate max_new_tokens
    # the next five: null takes an imported model's generation_config.json value (its do_sample for greedy), else
    # the default after the comment (MODEL_DEFAULTS; `resolved`)
    greedy: Optional[bool] = None  # argmax instead of sampling (false)
    temperature: Optional[float] = None  # (1.0)
    top_k: Optional[int] = None  # (0: no top-k filter)
    top_p: Optional[float] = None  # (1.0: no nucleus filter)
    repetition_penalty: Optional[float] = None  # (1.0: none; CTRL uses 1.2)
    no_repeat_ngram_size: int = 0  # no n-gram of this size twice in a text, its prompt included (0: no rule)
    # each prompt samples from numbers keyed by (seed, its index in the input, the step): same seed, same prompt at
    # the same index, same settings: same text, at any batch size; as translate --sampling's (null: a random seed)
    seed: Optional[int] = 1
    nbest: int = 1  # outputs per prompt (samples: each drawn from numbers of its own)
    stop: list[str] = field(default_factory=list)  # also stop (and cut) at any of these strings
    batch_size: int = 32  # rows (prompt x sample) generated together
    # the host reads the state from the device every N tokens (0: every token on the CPU, 8 on a GPU; every token
    # with --stop or when streaming one sample)
    check_every: int = 0
    # prompt input that is not UTF-8: strict (stop, naming file, line and column) or replace (U+FFFD a bad byte)
    encoding_errors: Literal["strict", "replace"] = "strict"
    device: str = "auto"
    dtype: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"
    threads: Optional[int] = None
    jsonl: bool = False  # one JSON object a sample: {"index", "sample", "prompt", "continuation"} (text may hold newlines)
    # each prompt is a user's message, written with the model's chat template (an imported chat model's); a prompt
    # line that is a JSON object with a "messages" list is a whole conversation; the reply alone is written
    chat: bool = False
    system: Optional[str] = None  # with chat: the system message said first

    # field -> (its generation_config.json key, tfcli's default): the settings a model's publisher may choose
    MODEL_DEFAULTS: ClassVar[dict[str, tuple[str, object]]] = {
        "greedy": ("do_sample", False), "temperature": ("temperature", 1.0), "top_k": ("top_k", 0),
        "top_p": ("top_p", 1.0), "repetition_penalty": ("repetition_penalty", 1.0),
    }

    def resolved(self, model: dict | None = None) -> tuple["GenerateConfig", dict]:
        """This config with every null of MODEL_DEFAULTS filled: from `model` (an imported model's
        generation_config.json values, meta "text"."generation") where it has the key, else tfcli's default.
        Returns it and the values taken from the model."""
        model = model or {}
        fill, taken = {}, {}
        for name, (key, default) in self.MODEL_DEFAULTS.items():
            if getattr(self, name) is not None:
                continue
            if key in model:
                value = (not model[key]) if name == "greedy" else model[key]
                fill[name] = taken[name] = value
            else:
                fill[name] = default
        return (dataclasses.replace(self, **fill) if fill else self), taken

    def validate(self) -> None:
        if self.max_new_tokens < 1 or self.nbest < 1 or self.batch_size < 1:
            raise ConfigError("generate: --max-new-tokens, --nbest and --batch-size must be positive")
        if self.check_every < 0:
            raise ConfigError("generate: --check-every must not be negative (0: the device's default)")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ConfigError("generate: --min-new-tokens must be between 0 and --max-new-tokens")
        if self.temperature is not None and self.temperature <= 0:
            raise ConfigError("generate: --temperature must be positive (use --greedy for the most likely text)")
        if (self.top_k is not None and self.top_k < 0) or (self.top_p is not None and not 0.0 < self.top_p <= 1.0):
            raise ConfigError("generate: --top-k must be >= 0 and --top-p in (0, 1]")
        if self.repetition_penalty is not None and self.repetition_penalty <= 0:
            raise ConfigError("generate: --repetition-penalty must be positive")
        if self.no_repeat_ngram_size < 0:
            raise ConfigError("generate: --no-repeat-ngram-size must not be negative (0: no rule)")
        if self.system is not None and not self.chat:
            raise ConfigError("generate: --system is the system message of a chat: give --chat too")
        if any(s == "" for s in self.stop):
            raise ConfigError("generate: --stop strings must not be empty")


def translate_config(path: os.PathLike | str | None = None, **flags) -> TranslateConfig:
    """Settings from a config file's `translate:` section (if any), then the non-None command-line flags."""
    cfg = TranslateConfig()
    if path is not None:
        cfg = from_dict(TranslateConfig, load_config_file(path).get("translate") or {}, "translate")
    return override(cfg, "translate", **flags)


def generate_config(path=None, **flags) -> GenerateConfig:
    """Settings from a config file's `generate:` section (if any), then the non-None command-line flags."""
    cfg = GenerateConfig()
    if path is not None:
        cfg = from_dict(GenerateConfig, load_config_file(path).get("generate") or {}, "generate")
    return override(cfg, "generate", **flags)
