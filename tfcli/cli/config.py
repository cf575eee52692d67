"""`tfcli config`: every config key with its default, as a file --config reads back."""

from __future__ import annotations

from typing import List, Optional

import typer

from tfcli.cli.common import (
    Quiet, app, check_choice, fail, run,
)
from tfcli.errors import EXIT_USAGE
from tfcli.generate.config import GenerateConfig, TranslateConfig
from tfcli.train.config import TrainConfig


@app.command("config")
def config_(
    sections: Optional[List[str]] = typer.Argument(
        None, metavar="SECTION", show_default=False,
        help="model, train, prepare, translate or generate \\[default: model and train, what `tfcli train -c` reads].",
    ),
    arch: str = typer.Option("small", "--arch", "-a", help="The preset whose shapes fill `model:`."),
    quiet: Quiet = False,
):
    """Print every config key with its default and help, as a file that --config accepts.

    tfcli config > train.yaml          model: and train:, for tfcli train prep/ -o run/ -c train.yaml
    tfcli config --arch lm-cpu         a language model's shapes
    tfcli config translate generate    the decoding sections (tfcli translate / lm-generate -c FILE)
    """
    from tfcli.model.config import PRESETS, RENAMED, renamed_message

    check_choice("SECTION", list(sections or []), list(CONFIG_SECTIONS))
    if arch in RENAMED:
        fail(renamed_message(arch), EXIT_USAGE)
    check_choice("--arch", arch, list(PRESETS))

    print(run(defaults_yaml, sections or ["model", "train"], arch), end="")


# every config section: each is defined beside the code it configures; the command line gathers them
CONFIG_SECTIONS = ("model", "train", "prepare", "translate", "generate")


def defaults_yaml(sections: list[str], arch: str = "small") -> str:
    """Every key of the chosen sections with its default and help; `model:` holds preset `arch`'s shapes
    (vocabulary sizes and kind come from the data and the preset, so they are not listed)."""
    from tfcli.config import annotated_yaml
    from tfcli.data.config import PrepareConfig
    from tfcli.model.config import preset

    make = {"model": lambda: preset(arch), "train": lambda: TrainConfig(arch=arch), "prepare": PrepareConfig,
            "translate": TranslateConfig, "generate": GenerateConfig}
    skip = {"model": {"kind", "src_vocab_size", "tgt_vocab_size"}}
    return annotated_yaml({name: make[name]() for name in sections}, skip)
