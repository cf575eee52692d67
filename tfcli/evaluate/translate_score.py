"""`tfcli eval --model CKPT --translate SRC -r REF`: translate with `tfcli translate`'s own code, then score."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tfcli.errors import ConfigError
from tfcli.evaluate.config import MetricsConfig
from tfcli.evaluate.metrics import Report, check_lengths, read_scored, score
from tfcli.generate.config import TranslateConfig
from tfcli.generate.translate import translate
from tfcli.io import encoding_errors, refuse_overwriting_inputs


def translate_and_score(
    ckpt: str,
    source: str,
    references: list[str],
    metrics: MetricsConfig,
    decoding: TranslateConfig,
    output: str | None = None,
    progress: bool | None = None,
) -> Report:
    """Translate `source` (`-` = stdin) with checkpoint `ckpt`, keep the translations in `output` if given, and
    score them against `references`. Line counts are checked before the (slow) translation when possible."""
    if decoding.tabular or decoding.raw:
        raise ConfigError("--nbest, --scores and --raw make output that is not plain translations; BLEU needs text")
    if output is not None:
        from tfcli.checkpoint_meta import input_paths

        refuse_overwriting_inputs([output], [source, *references, *input_paths(ckpt)], "choose another -o")
    with encoding_errors(decoding.encoding_errors):  # the references and the source alike
        refs = {p: read_scored(p) for p in references}
        if source != "-":
            check_lengths({source: read_scored(source)}, refs)
    with tempfile.TemporaryDirectory(prefix="tfcli-eval-") as tmp:
        out = output or str(Path(tmp) / "translations.txt")
        translate(ckpt, [source], out, decoding, progress)
        hypotheses = read_scored(out)
    name = output or f"{ckpt} on {'<stdin>' if source == '-' else source}"
    return score({name: hypotheses}, refs, metrics)
