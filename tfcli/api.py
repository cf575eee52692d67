"""tfcli from Python: load a trained model, then translate, generate or score in a script.

    import tfcli
    translator = tfcli.load("runs/de-en")                       # a run directory or one of its checkpoints
    translator.translate(["Ein Hund rennt."], beam_size=5)       # -> ["A dog is running."]
    translator.translate_nbest(["Ein Hund rennt."], nbest=3)         # -> [[Translation(text, score, ...), ...]]
    lm = tfcli.load("runs/shakespeare")                          # a language model gives a Generator
    lm.generate(["ROMEO:"], max_new_tokens=50, top_p=0.9, seed=1)
    tfcli.score(hypotheses, references, metrics=["bleu", "chrf"])  # -> {"BLEU": Score(score, signature), ...}

The options are those of `tfcli translate`, `tfcli lm-generate` and `tfcli eval` (the fields of TranslateConfig,
GenerateConfig and MetricsConfig), with the same defaults, and the same code runs behind both. Loading changes nothing
outside the returned object: not torch's thread count, not the allocator, not the model's parameters (decoding runs
on weights packed beside them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tfcli.config import override
from tfcli.request import FieldError, Request, Translation
from tfcli.errors import ConfigError


# what each method takes; the rest of TranslateConfig/GenerateConfig belongs to `load` or to the command line
_TRANSLATE = ("beam_size", "len_penalty", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size",
              "repetition_penalty", "batch_size", "max_tokens",
              "buffer_size", "check_every", "raw", "sampling", "temperature", "top_k", "top_p", "seed",
              "split_sentences", "src_lang", "glossary", "input_format", "protect", "placeholders", "keep_tags",
              "prompt_template",
              "topk", "topp")  # (topk, topp: the old names of top_k, top_p)
_NBEST_ONLY = ("scores", "alignment", "alignment_layer")
_GENERATE = ("max_new_tokens", "min_new_tokens", "ignore_eos", "greedy", "temperature", "top_k", "top_p",
             "repetition_penalty", "no_repeat_ngram_size", "seed", "stop", "batch_size", "check_every", "chat",
             "system")
_FIXED_BY_LOAD = ("device", "dtype")


def _check_options(method: str, options: dict, allowed: tuple[str, ...]) -> None:
    """Options a method does not take are a TypeError naming them and where they belong, never silently ignored."""
    for name in options:
        if name in allowed:
            continue
        if name in _FIXED_BY_LOAD:
            why = f"it is fixed when the model is loaded: tfcli.load(path, {name}=...)"
        elif name == "threads":
            why = "the API never changes the process's thread count: call torch.set_num_threads yourself"
        elif method == "translate" and name in _NBEST_ONLY + ("nbest", "n"):
            why = "it is an option of translate_nbest(texts, nbest=..., scores=...)"
        elif name == "num_samples" or (method == "generate" and name == "nbest"):
            why = "repeat a prompt for more samples of it"
        elif name in ("nbest", "tabular"):
            why = "use translate_nbest(texts, nbest=...)"
        else:
            why = f"it takes {', '.join(allowed)}"
        raise TypeError(f"{method}() got an unexpected option {name!r}: {why}")


def _configured(method: str, make):
    """`make()`'s config, validated; its errors name the method's arguments (`beam_size`), not the command line's
    flags (`--beam-size`), which the messages are written with."""
    import re

    try:
        cfg = make()
        cfg.validate()
        return cfg
    except ConfigError as e:
        text = re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), str(e))
        text = re.sub(r"^(translate|generate|eval)(\.(\w+))?: ", lambda m: f"{m.group(3)}: " if m.group(3) else "", text)
        raise ConfigError(f"{method}(): {text}") from None


def _per_text(value, name: str, texts: list[str]) -> list | None:
    """`avoid=` or `constraints=`: one list of phrases a text (each list's phrases are checked by Request)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or len(value) != len(texts):
        raise ConfigError(f"{name}: give one list of phrases a text ({len(texts)} texts; [] for none)")
    return list(value)


def _texts(value, name: str) -> list[str]:
    """A list of strings, checked: one string (which would be iterated character by character), None, bytes or
    other objects as items are a TypeError that says what to pass."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}: expected a list of strings, got one {type(value).__name__}; pass [text] for a "
                        "single text")
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{name}: expected a list of strings, got {type(value).__name__}") from None
    for i, item in enumerate(items):
        if isinstance(item, str):
            continue
        if item is None:
            raise TypeError(f"{name}[{i}]: None; expected a string (use '' for an empty line)")
        hint = "; decode it first (.decode('utf-8'))" if isinstance(item, (bytes, bytearray)) else ""
        raise TypeError(f"{name}[{i}]: expected a string, got {type(item).__name__}{hint}")
    return items


def _languages(options: dict, name: str, texts: list[str]) -> list[str] | None:
    """Option `name`, a language for all texts (left in `options`) or a list of one a text (taken out, returned)."""
    value = options.get(name)
    if value is None or isinstance(value, str):
        if value is None:
            options.pop(name, None)
        return None
    values = _texts(options.pop(name), name)
    if len(values) != len(texts):
        raise ConfigError(f"{name}: {len(values)} languages for {len(texts)} texts; give one, or one a text")
    return values


class Translator:
    """A translation model ready to translate lists of sentences."""

    def __init__(self, loaded, device: torch.device, dtype: str):
        self.loaded, self.device, self.dtype = loaded, device, dtype
        self.model = loaded.model  # the trained torch module, as it was loaded (eval mode)

    def translate(self, texts: list[str], **options) -> list[str]:
        """The best translation of each text. `options`: beam_size (5; 1 is greedy), len_penalty, max_len_a,
        max_len_b, min_len, no_repeat_ngram_size, repetition_penalty, batch_size, max_tokens, buffer_size,
        check_every, raw (subword tokens instead of text); or
        sampling=True with temperature, top_k, top_p and seed: one draw a text, keyed by the seed and its index;
        prefixes: one target prefix a text ('' for none), which its translation starts with; avoid: one list of
        target phrases a text ([] for none), none of which its translation holds; constraints: one list of target
        phrases a text ([] for none), every one of which its translation holds (beam search); glossary: a TSV/CSV
        file (or a list of them), or a {source term: target term (or a list of alternatives)} mapping, each source
        term found in a text making its target term a constraint (tfcli/generate/glossary.py); input_format: "xml"
        or "html" for texts with inline markup, the tags put back around the words they enclosed, with
        placeholders, protect (regular expressions) and keep_tags (elements copied whole; tfcli/formats/); tgt_lang: a
        multilingual model's target language, one for all texts or a list of one a text; src_lang: the texts'
        language (what an imported M2M-100 or NLLB model needs, and the sentence splitter's rules), also one or one
        a text."""
        _check_options("translate", options, _TRANSLATE + ("prefixes", "tgt_lang", "avoid", "constraints"))
        return [hyps[0].text for hyps in self._nbest(_texts(texts, "texts"), None, options)]

    def translate_nbest(self, texts: list[str], nbest: int = 1, **options) -> list[list[Translation]]:
        """The `nbest` best translations of each text with their scores, best first (`scores=True` adds per-token
        log-probs; `alignment=True` word alignments from the cross-attention of decoder layer `alignment_layer`,
        1-based, by default the penultimate); `n=`, its earlier name, still works. An empty text gives one empty
        translation with score 0. Other `options` as for `translate`."""
        if "n" in options:
            nbest = options.pop("n")
        _check_options("translate_nbest", options, _TRANSLATE + _NBEST_ONLY + ("prefixes", "tgt_lang", "avoid",
                                                                               "constraints"))
        if isinstance(nbest, bool) or not isinstance(nbest, int):
            raise TypeError(f"nbest: expected an int, got {type(nbest).__name__}")
        return self._nbest(_texts(texts, "texts"), nbest, options)

    def translate_file(self, path: str, output: str, **options) -> int:
        """Translate a whole file with its structure kept (input_format: "auto" by its extension, or html-page,
        markdown, srt, vtt, po, xliff, json; overwrite: PO/XLIFF entries with a translation too; other options as
        for `translate`), written atomically to `output`; returns the segments translated."""
        from tfcli.formats import files
        from tfcli.generate.config import TranslateConfig
        from tfcli.generate.translate import Pipeline, translate_file
        from tfcli.io import refuse_overwriting_inputs

        _check_options("translate_file", options, _TRANSLATE + ("tgt_lang", "overwrite"))
        glossary = _glossary(options)
        fmt = files.choose(options.pop("input_format", "auto"), str(path))
        if fmt not in files.FILE_FORMATS:
            raise ConfigError(f"translate_file(): {path} is read as {fmt}, not a file format: give input_format=, "
                              f"one of {', '.join(files.FILE_FORMATS)} (or use translate() for lines)")
        cfg = _configured("translate_file", lambda: override(TranslateConfig(device=str(self.device), dtype=self.dtype),
                                                              "translate", input_format=fmt, **options))
        refuse_overwriting_inputs([str(output)], [str(path)], "choose another output")
        return translate_file(Pipeline(self.loaded, cfg, self.device, glossary), cfg, str(path), str(output), False)

    def _nbest(self, texts: list[str], n: int | None, options: dict) -> list[list[Translation]]:
        """`n` None: the best translation of each text, unscored (its score is not read: greedy search skips it)."""
        from tfcli.generate.config import TranslateConfig
        from tfcli.generate.translate import Pipeline

        if options.get("sampling") and "beam_size" in options:
            raise ConfigError("beam_size: not used with sampling (one draw a text)")
        avoid, constraints = (_per_text(options.pop(name, None), name, texts) for name in ("avoid", "constraints"))
        prefixes = options.pop("prefixes", None)
        if prefixes is not None:
            prefixes = _texts(prefixes, "prefixes")
            if len(prefixes) != len(texts):
                raise ConfigError(f"prefixes: {len(prefixes)} for {len(texts)} texts; give one a text ('' for none)")
        langs, src_langs = (_languages(options, name, texts) for name in ("tgt_lang", "src_lang"))
        glossary = _glossary(options)
        if options.get("input_format", "text") not in ("auto", "text", "xml", "html"):
            raise ConfigError(f"input_format: {options['input_format']!r}: translate() takes texts (text, xml, html); "
                              "translate_file() takes files")
        cfg = _configured("translate", lambda: override(TranslateConfig(device=str(self.device), dtype=self.dtype),
                                                        "translate", nbest=n, **options))
        requests = [_request(i, text, prefixes, langs, src_langs, avoid, constraints) for i, text in enumerate(texts)]
        return [t for _, t in Pipeline(self.loaded, cfg, self.device, glossary).translations(requests)]


def _glossary(options: dict):
    """`glossary=`: a file (or a list of files: left in `options`, for the config), or a {source term: target
    term, or a list of alternative target terms} mapping (taken out, returned as a Glossary)."""
    from tfcli.generate.glossary import Glossary, Term

    value = options.get("glossary")
    if isinstance(value, (str, os.PathLike)):
        options["glossary"] = [str(value)]
    elif isinstance(value, dict):
        del options["glossary"]
        terms = []
        for source, target in value.items():
            forms = [target] if isinstance(target, str) else _texts(target, f"glossary[{source!r}]")
            if not isinstance(source, str) or not forms or not all(forms):
                raise ConfigError(f"glossary[{source!r}]: a source term maps to a target term or a list of them")
            terms.append(Term(source, tuple(forms), f"glossary[{source!r}]"))
        return Glossary(terms)
    elif value is not None:
        options["glossary"] = [str(p) for p in value]
    return None


def _request(i: int, text: str, prefixes, langs, src_langs, avoid, constraints) -> Request:
    """Text `i` and its own options as a Request; a malformed phrase list is a TypeError (a wrong type) or a
    ConfigError naming the argument and the text."""
    try:
        return Request(text, "<text>", i + 1, src_langs[i] if src_langs else None, langs[i] if langs else None,
                       prefixes[i] if prefixes else "", avoid[i] if avoid else None,
                       constraints[i] if constraints else None)
    except FieldError as e:
        raise (TypeError if e.wrong_type else ConfigError)(f"{e.field}[{i}]: {e}") from None


class Generator(Translator):
    """A language model ready to continue prompts (`generate`), and to translate as a Translator does, each text
    in a prompt: `prompt_template` (with {text}, {src_lang}, {tgt_lang}), or its chat template around a translation
    instruction (tgt_lang, and src_lang, name the languages; tfcli/generate/prompting.py)."""

    def generate(self, prompts: list[str], **options) -> list[str]:
        """The continuation of each prompt (without the prompt). `options`: max_new_tokens (100), min_new_tokens,
        ignore_eos, greedy, temperature, top_k, top_p, repetition_penalty, no_repeat_ngram_size, seed, stop (a string
        or a list of them), batch_size, check_every; chat (each prompt a user's message, or a conversation: a list of
        {"role", "content"} messages, written with the model's chat template; the reply is returned), system (with
        chat: the system message). For several samples of a prompt, repeat it."""
        from tfcli.generate.config import GenerateConfig
        from tfcli.generate.lm import continuations

        _check_options("generate", options, _GENERATE)
        if options.get("chat"):
            prompts = [p if isinstance(p, str) else _conversation(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        else:
            prompts = _texts(prompts, "prompts")
        if isinstance(options.get("stop"), str):
            options["stop"] = [options["stop"]]
        elif options.get("stop") is not None:
            options["stop"] = _texts(options["stop"], "stop")
        cfg = _configured("generate", lambda: override(GenerateConfig(device=str(self.device), dtype=self.dtype),
                                                       "generate", **options))
        return list(continuations(self.loaded, prompts, cfg, self.device))


def _conversation(value, name: str) -> list[dict]:
    """A chat's messages, checked: a list of {"role": system/user/assistant/tool, "content": text}."""
    from tfcli.generate.chat import ROLES

    items = list(value) if isinstance(value, (list, tuple)) else None
    if not items or not all(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
                            for m in items):
        raise TypeError(f"{name}: expected a text or a non-empty list of {{'role': one of {', '.join(ROLES)}, "
                        "'content': text}} messages")
    return [dict(m) for m in items]


def load(path: str | list[str], device: str = "auto", dtype: str = "fp32") -> Translator | Generator:
    """A Translator for a translation checkpoint, a Generator for a language model. `path`: a run directory (its
    best checkpoint) or a checkpoint directory, or a list of translation checkpoints that decode as an ensemble
    (their probabilities averaged; they must share their tokenizers); `device`: auto, cpu, cuda, cuda:N; `dtype`:
    fp32, bf16, fp16, int8 (CPU). Loading leaves the process as it was: torch's random stream, threads and
    allocator included."""
    from tfcli.device import DTYPE_NAMES, precision, resolve_device
    from tfcli.generate.loader import load as load_checkpoint
    from tfcli.generate.loader import load_ensemble

    paths = path if isinstance(path, (list, tuple)) else None
    for name, value in (("device", device), ("dtype", dtype), *(("path", p) for p in (paths or [path]))):
        if not isinstance(value, (str, os.PathLike)) or (name != "path" and not isinstance(value, str)):
            raise TypeError(f"{name}: expected a string, got {type(value).__name__}")
    if paths is not None and not paths:
        raise ConfigError("path: an empty list; give one checkpoint, or several for an ensemble")
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype: unknown dtype {dtype!r}; choose from {', '.join(DTYPE_NAMES)}")
    dev = resolve_device(device)
    precision(dev, dtype)  # an impossible precision fails before loading
    if paths is not None:
        return Translator(load_ensemble([str(p) for p in paths], dev, dtype), dev, dtype)
    loaded = load_checkpoint(str(path), dev, None, dtype)
    return (Translator if loaded.cfg.kind == "seq2seq" else Generator)(loaded, dev, dtype)


@dataclass
class Score:
    score: float
    signature: str  # sacrebleu's, e.g. nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.2
    details: object  # sacrebleu's own Score object (BLEU: precisions, brevity penalty, lengths)


def score(hypotheses: list[str], references: list[str] | list[list[str]], metrics=("bleu", "chrf"),
          **options) -> dict[str, Score]:
    """sacreBLEU scores of `hypotheses` against one list of references (or a list of such lists), as `tfcli eval`
    computes them: {name as sacrebleu prints it (BLEU, chrF2, chrF2++, TER): Score}. `metrics`: bleu, chrf, ter (a
    list, or one string as `--metrics` takes it: "bleu,chrf"); `options`: tokenize ("13a"), lowercase,
    chrf_word_order (2 for chrF++), ter_case_sensitive."""
    from tfcli.evaluate.config import MetricsConfig
    from tfcli.evaluate.metrics import score as score_systems

    _check_options("score", options, ("tokenize", "lowercase", "chrf_word_order", "chrf_char_order", "chrf_beta",
                                      "ter_case_sensitive"))
    hypotheses = _texts(hypotheses, "hypotheses")
    if isinstance(references, (str, bytes)):
        _texts(references, "references")  # the TypeError that says what to pass
    references = list(references)
    if references and not isinstance(references[0], str) and references[0] is not None:
        sets = [_texts(ref, f"references[{i}]") for i, ref in enumerate(references)]
    else:
        sets = [_texts(references, "references")]  # one reference set
    if not hypotheses:
        raise ConfigError("hypotheses: empty; a corpus score needs at least one line")
    for i, ref in enumerate(sets):
        if len(ref) != len(hypotheses):
            where = "references" if len(sets) == 1 else f"references[{i}]"
            raise ConfigError(f"{where}: {len(ref)} lines for {len(hypotheses)} hypotheses; they must be line-aligned")
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    metrics = _texts(metrics, "metrics")
    cfg = _configured("score", lambda: override(MetricsConfig(), "eval", metrics=[m.lower() for m in metrics], **options))
    refs = {f"reference set {i + 1}": [r.rstrip() for r in ref] for i, ref in enumerate(sets)}
    report = score_systems({"hypotheses": [h.rstrip() for h in hypotheses]}, refs, cfg)
    return {name: Score(s.score, report.signatures[name], s) for name, s in report.systems[0].scores.items()}
