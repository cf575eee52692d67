"""tfcli: a command-line Transformer toolkit, and its Python API (tfcli/api.py):

    import tfcli
    tfcli.load("runs/de-en").translate(["Ein Hund rennt."])
"""

__version__ = "0.1.0"

_API = ("load", "score", "Translator", "Generator", "Translation", "Score")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    """The API on first use, so that `import tfcli` (and the command line's start) does not import torch."""
    if name in _API:
        from tfcli import api

        return getattr(api, name)
    raise AttributeError(f"module 'tfcli' has no attribute {name!r}")
