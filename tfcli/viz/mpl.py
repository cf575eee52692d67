"""matplotlib, imported lazily and used without pyplot: no global state, no GUI backend, nothing to close."""

from __future__ import annotations

import os

from tfcli.errors import TfcliError
from tfcli.io import atomic_open


def have_matplotlib() -> bool:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        return False
    return True


def new_figure(what: str, **kwargs):
    """A matplotlib Figure on the Agg canvas; `what` names the feature for the install hint."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TfcliError(f"{what} needs matplotlib: pip install 'tfcli[plot]'") from None
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: os.PathLike | str, dpi: float | None = None) -> None:
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)
