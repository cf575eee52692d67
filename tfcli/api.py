"""tfcli from Python: load a trained model, then translate, generate or score in a script.

    import tfcli
    translator = tfcli.load("runs/de-en")                       # a run directory or one of its checkpoints
    translator.translate(["Ein Hund rennt."], beam_size=5)       # -> ["A dog is running."]
    translator.translate_nbest(["Ein Hund rennt."], n=3)         # -> [[Translation(text, score, ...), ...]]
    lm = tfcli.load("runs/shakespeare")                          # a language model gives a Generator
    lm.generate(["ROMEO:"], max_new_tokens=50, top_p=0.9, seed=1)
    tfcli.score(hypotheses, references, metrics=["bleu", "chrf"])  # -> {"BLEU": Score(score, signature), ...}

The options are those of `tfcli translate`, `tfcli lm-generate` and `tfcli eval` (the fields of TranslateConfig,
GenerateConfig and MetricsConfig), with the same defaults, and the same code runs behind both. Loading changes nothing
outside the returned object: not torch's thread count, not the allocator, not the model's parameters (decoding runs
on weights packed beside them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli import checkpoint
from tfcli.config import override
from tfcli.errors import ConfigError


@dataclass
class Translation:
    text: str
    score: float  # sum of token log-probs / ((5 + |Y|) / 6)^len_penalty, as `tfcli translate --nbest` prints it
    token_scores: list[float] | None = None  # log p of each token (and of </s>), with scores=True


class Translator:
    """A translation model ready to translate lists of sentences."""

    def __init__(self, loaded, device: torch.device, dtype: str):
        self.loaded, self.device, self.dtype = loaded, device, dtype
        self.model = loaded.model  # the trained torch module, as it was loaded (eval mode)

    def translate(self, texts: list[str], **options) -> list[str]:
        """The best translation of each text. `options`: beam_size (5; 1 is greedy), len_penalty, max_len_a,
        max_len_b, min_len, batch_size, max_tokens, raw (subword tokens instead of text)."""
        return [hyps[0].text for hyps in self.translate_nbest(texts, n=1, **options)]

    def translate_nbest(self, texts: list[str], n: int = 1, **options) -> list[list[Translation]]:
        """The n best translations of each text with their scores, best first (`scores=True` adds per-token
        log-probs). An empty text gives one empty translation with score 0."""
        from tfcli.generate.config import TranslateConfig
        from tfcli.generate.translate import Translator as Lines

        cfg = override(TranslateConfig(device=str(self.device), dtype=self.dtype), "translate", nbest=n, **options)
        cfg.validate()
        lines = Lines(self.loaded, cfg, self.device)
        out = []
        for _, hyps in lines.hypotheses(("<text>", i + 1, text) for i, text in enumerate(texts)):
            out.append([Translation(t, h.score, h.token_scores if cfg.scores else None)
                        for h, t in zip(hyps, lines.texts(hyps))])
        return out


class Generator:
    """A language model ready to continue prompts."""

    def __init__(self, loaded, device: torch.device, dtype: str):
        self.loaded, self.device, self.dtype = loaded, device, dtype
        self.model = loaded.model

    def generate(self, prompts: list[str], **options) -> list[str]:
        """The continuation of each prompt (without the prompt). `options`: max_new_tokens (100), greedy,
        temperature, top_k, top_p, repetition_penalty, seed, stop (strings), batch_size. For several samples of a
        prompt, repeat it."""
        from tfcli.generate.config import GenerateConfig
        from tfcli.generate.lm import continuations

        cfg = override(GenerateConfig(device=str(self.device), dtype=self.dtype), "generate", **options)
        cfg.validate()
        if cfg.num_samples != 1:
            raise ConfigError("generate: num_samples is the command line's; repeat a prompt for more samples")
        return list(continuations(self.loaded, list(prompts), cfg, self.device))


def load(path: str, device: str = "auto", dtype: str = "fp32") -> Translator | Generator:
    """A Translator for a translation checkpoint, a Generator for a language model. `path`: a run directory (its
    best checkpoint) or a checkpoint directory; `device`: auto, cpu, cuda, cuda:N; `dtype`: fp32, bf16, fp16, int8 (CPU)."""
    from tfcli.generate import runtime

    dev = runtime.resolve_device(device)
    runtime.precision(dev, dtype)  # an impossible precision fails before loading
    kind = checkpoint.model_config(checkpoint.read_meta(path)).kind
    loaded = runtime.load(path, dev, kind, dtype)
    return (Translator if kind == "seq2seq" else Generator)(loaded, dev, dtype)


@dataclass
class Score:
    score: float
    signature: str  # sacrebleu's, e.g. nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.2
    details: object  # sacrebleu's own Score object (BLEU: precisions, brevity penalty, lengths)


def score(hypotheses: list[str], references: list[str] | list[list[str]], metrics=("bleu", "chrf"),
          **options) -> dict[str, Score]:
    """sacreBLEU scores of `hypotheses` against one list of references (or a list of such lists), as `tfcli eval`
    computes them: {name as sacrebleu prints it (BLEU, chrF2, chrF2++, TER): Score}. `metrics`: bleu, chrf, ter;
    `options`: tokenize ("13a"), lowercase, chrf_word_order (2 for chrF++), ter_case_sensitive."""
    from tfcli.evaluate.metrics import MetricsConfig
    from tfcli.evaluate.metrics import score as score_systems

    if references and isinstance(references[0], str):
        references = [references]  # one reference set
    cfg = override(MetricsConfig(), "eval", metrics=list(metrics), **options)
    cfg.validate()
    refs = {f"reference set {i + 1}": [r.rstrip() for r in ref] for i, ref in enumerate(references)}
    report = score_systems({"hypotheses": [h.rstrip() for h in hypotheses]}, refs, cfg)
    return {name: Score(s.score, report.signatures[name], s) for name, s in report.systems[0].scores.items()}
