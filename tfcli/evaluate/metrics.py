"""Text metrics through sacrebleu's Python API: BLEU, chrF / chrF++ and TER, several systems, significance tests.

Scores, signatures and p-values are sacrebleu's own; nothing is re-implemented. Lines are read as the `sacrebleu`
command line reads them (trailing whitespace stripped), so `tfcli eval` and `sacrebleu` agree to the last digit.
Paired significance tests use sacrebleu's `PairedTest` (paired bootstrap resampling, Koehn 2004, or paired
approximate randomisation, Riezler & Maxwell 2005) with sacrebleu's seed (12345, or $SACREBLEU_SEED).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric, Score

from tfcli.errors import TfcliError
from tfcli.evaluate.config import MetricsConfig
from tfcli.io import encoding_errors, read_lines

TOKENIZERS = tuple(BLEU.TOKENIZERS)  # 13a, intl, char, none, zh, ja-mecab, ko-mecab, spm, flores101, flores200, ...


@dataclass
class SystemScores:
    name: str
    n_lines: int
    scores: dict[str, Score]  # metric name as sacrebleu prints it (BLEU, chrF2, chrF2++, TER) -> Score
    p_values: dict[str, float] = field(default_factory=dict)  # paired tests only; not for the baseline
    means: dict[str, tuple[float, float]] = field(default_factory=dict)  # bootstrap (mean, 95% CI half-width)
    baseline: bool = False


@dataclass
class Report:
    references: list[str]
    systems: list[SystemScores]
    signatures: dict[str, str]  # metric name -> sacrebleu signature string
    paired: str = "none"
    n_samples: int = 0
    seed: str = ""


def read_scored(path: str) -> list[str]:
    """Lines of a hypothesis or reference file (`-` = stdin), trailing whitespace stripped as sacrebleu does."""
    return read_lines(path, rstrip=True)


def display_name(path: str) -> str:
    return "<stdin>" if path == "-" else path


def check_lengths(files: dict[str, list[str]], references: dict[str, list[str]]) -> None:
    """Every hypothesis and reference file must have the same number of lines; name both files if not."""
    ref_name, ref_lines = next(iter(references.items()))
    for name, lines in list(references.items())[1:] + list(files.items()):
        if len(lines) != len(ref_lines):
            raise TfcliError(
                f"line counts differ: {display_name(name)} has {len(lines)} lines but "
                f"{display_name(ref_name)} has {len(ref_lines)}; hypotheses and references must be line-aligned"
            )
    if not ref_lines:
        raise TfcliError(f"{display_name(ref_name)}: empty reference file")


def build_metrics(cfg: MetricsConfig, references: list[list[str]]) -> dict[str, Metric]:
    """sacrebleu metric objects with the references cached (keys BLEU, CHRF, TER as in sacrebleu's CLI)."""
    metrics: dict[str, Metric] = {}
    try:
        for m in cfg.metrics:
            if m == "bleu":
                metrics["BLEU"] = BLEU(lowercase=cfg.lowercase, tokenize=cfg.tokenize, references=references)
            elif m == "chrf":
                metrics["CHRF"] = CHRF(
                    char_order=cfg.chrf_char_order, word_order=cfg.chrf_word_order, beta=cfg.chrf_beta,
                    lowercase=cfg.lowercase, references=references,
                )
            elif m == "ter":
                metrics["TER"] = TER(case_sensitive=cfg.ter_case_sensitive, references=references)
    except (ImportError, RuntimeError, OSError) as e:  # e.g. ja-mecab without mecab-python3, spm without network
        message = " ".join(str(e).split())  # sacrebleu's messages span lines; ours are one line
        raise TfcliError(f"cannot set up {m.upper()} (--tokenize {cfg.tokenize}): {message}") from None
    return metrics


def score_files(hyp_paths: list[str], ref_paths: list[str], cfg: MetricsConfig, baseline: str | None = None,
                errors: str = "strict") -> Report:
    """Read and score hypothesis files (`-` = stdin) against reference files; `baseline` (or the first file) comes
    first and is the baseline of a paired test. `errors`: how input that is not UTF-8 is read (io.encoding_errors)."""
    with encoding_errors(errors):
        return _score_files(hyp_paths, ref_paths, cfg, baseline)


def _score_files(hyp_paths: list[str], ref_paths: list[str], cfg: MetricsConfig, baseline: str | None) -> Report:
    if not ref_paths:
        raise TfcliError("no reference file: pass one or more with -r REF")
    paths = list(hyp_paths)
    if baseline is not None:
        paths = [baseline] + [p for p in paths if p != baseline]
    for files, what in ((paths, "hypothesis"), (ref_paths, "reference")):
        for p in set(files):
            if files.count(p) > 1:
                raise TfcliError(f"{display_name(p)}: given twice as a {what} file")
    if not paths:
        raise TfcliError("no hypothesis file (and nothing on stdin)")
    references = {p: read_scored(p) for p in ref_paths}
    hypotheses = {p: read_scored(p) for p in paths}
    return score(hypotheses, references, cfg)


def score(
    hypotheses: dict[str, list[str]],
    references: dict[str, list[str]],
    cfg: MetricsConfig,
) -> Report:
    """Score each system (name -> lines) against the references (name -> lines); the first system is the baseline
    of the paired test when one is asked for."""
    if cfg.paired != "none" and len(hypotheses) < 2:
        raise TfcliError("a paired significance test needs at least two systems (a baseline and one more)")
    check_lengths(hypotheses, references)
    refs = list(references.values())
    metrics = build_metrics(cfg, refs)

    systems, signatures = [], {}
    for name, lines in hypotheses.items():
        scores = {}
        for metric in metrics.values():
            s = metric.corpus_score(lines, None)
            scores[s.name] = s
            signatures[s.name] = metric.get_signature().format()
        systems.append(SystemScores(name, len(lines), scores))

    report = Report(list(references), systems, signatures)
    if cfg.paired != "none":
        _paired_test(report, hypotheses, metrics, cfg)
    return report


def _paired_test(report: Report, hypotheses: dict[str, list[str]], metrics: dict[str, Metric], cfg: MetricsConfig):
    """Run sacrebleu's paired test against the first system; adds p-values, bootstrap means and signatures."""
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        list(hypotheses.items()), metrics, references=None, test_type=cfg.paired, n_samples=cfg.n_samples
    )
    signatures, results = test()
    report.paired, report.n_samples, report.seed = cfg.paired, test.n_samples, os.environ.get("SACREBLEU_SEED", "12345")
    report.signatures = {name: sig.format() for name, sig in signatures.items()}
    report.systems[0].baseline = True
    for name, column in results.items():
        if name == "System":
            continue
        for system, result in zip(report.systems, column):
            if result.p_value is not None:
                system.p_values[name] = float(result.p_value)
            if result.mean is not None:
                system.means[name] = (float(result.mean), float(result.ci))


# --- output ----------------------------------------------------------------------------------------------------


def score_dict(s: Score) -> dict:
    """A sacrebleu Score as plain JSON: the full-precision score plus each metric's statistics."""
    out = {"score": float(s.score)}
    for key in ("counts", "totals", "precisions", "bp", "sys_len", "ref_len", "ratio", "num_edits", "ref_length"):
        if hasattr(s, key):
            v = getattr(s, key)
            out[key] = [float(x) if isinstance(x, float) else int(x) for x in v] if isinstance(v, list) else v
    if getattr(s, "_verbose", ""):
        out["verbose_score"] = s._verbose
    return out


def to_json(report: Report) -> dict:
    systems = []
    for sys_ in report.systems:
        scores = {}
        for name, s in sys_.scores.items():
            d = score_dict(s)
            if name in sys_.means:
                d["bootstrap_mean"], d["bootstrap_ci95"] = sys_.means[name]
            if name in sys_.p_values:
                d["p_value"] = sys_.p_values[name]
            scores[name] = d
        systems.append({"name": display_name(sys_.name), "lines": sys_.n_lines, "baseline": sys_.baseline, "scores": scores})
    significance = None
    if report.paired != "none":
        significance = {
            "test": "paired-bs" if report.paired == "bs" else "paired-ar",
            "n_samples": report.n_samples,
            "seed": report.seed,
            "baseline": display_name(report.systems[0].name),
        }
    return {
        "references": [display_name(r) for r in report.references],
        "signatures": report.signatures,
        "systems": systems,
        "significance": significance,
    }


def format_single(report: Report, width: int = 2, score_only: bool = False) -> str:
    """One system: `BLEU = 34.12 65.3/40.1/27.0/18.7 (BP = ...)` per metric, then the signatures."""
    (system,) = report.systems
    if score_only:
        return "\n".join(f"{s.score:.{width}f}" for s in system.scores.values())
    names = list(system.scores)
    pad = max(len(n) for n in names)
    lines = []
    for name, s in system.scores.items():
        line = f"{name:<{pad}} = {s.score:.{width}f}"
        if getattr(s, "_verbose", ""):
            line += f" {s._verbose}"
        lines.append(line)
    lines.append("")
    lines += [f"{name:<{pad}}   {report.signatures[name]}" for name in names]
    return "\n".join(lines)


def render_table(report: Report, console, width: int = 2) -> None:
    """Several systems: a rich table (one row per system), then the test's description and the signatures."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    names = list(report.systems[0].scores)
    paired = report.paired != "none"
    table = Table(box=box.SQUARE if console.is_terminal else box.ASCII, show_lines=paired)
    table.add_column("System", justify="right", no_wrap=True)
    for name in names:
        table.add_column(f"{name} (μ ± 95% CI)" if report.paired == "bs" else name, justify="center", no_wrap=True)
    for sys_ in report.systems:
        cells = []
        for name in names:
            cell = f"{sys_.scores[name].score:.{width}f}"
            if name in sys_.means:
                mean, ci = sys_.means[name]
                cell += f" ({mean:.{width}f} ± {ci:.{width}f})"
            if name in sys_.p_values:
                p = sys_.p_values[name]
                cell += f"\n(p = {p:.4f})" + ("*" if p < 0.05 else "")
            cells.append(cell)
        label = f"Baseline: {display_name(sys_.name)}" if sys_.baseline else display_name(sys_.name)
        table.add_row(Text(label), *cells, style="yellow" if sys_.baseline and console.is_terminal else None)
    console.print(table)
    if paired:
        test = (
            f"paired bootstrap resampling, {report.n_samples} resamples"
            if report.paired == "bs"
            else f"paired approximate randomization, {report.n_samples} trials"
        )
        console.print(
            f"Significance: {test} (seed {report.seed}), each system against the baseline. "
            "p is roughly the chance of a score difference at least this large if both systems came from the same "
            "process; * marks p < 0.05 (a significant difference, not necessarily an improvement).",
            markup=False,
            soft_wrap=True,
        )
    console.print("Signatures:")
    pad = max(len(n) for n in names)
    for name in names:
        console.print(f"  {name:<{pad}}  {report.signatures[name]}", markup=False, soft_wrap=True)
