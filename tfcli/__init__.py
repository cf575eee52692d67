"""tfcli: a command-line Transformer toolkit, and its Python API (tfcli/api.py):

    import tfcli
    tfcli.load("runs/de-en").translate(["Ein Hund rennt."])
"""

__version__ = "0.1.0"

_API = ("load", "score", "Translator", "Generator", "Translation", "Score")
__all__ = ["__version__", *_API]


def lazy(package: str, names: dict[str, str]):
    """A package's `__getattr__` that imports each of `names` (name -> module in the package) on first use, so that
    importing the package stays cheap (the command line's start does not import torch)."""
    import importlib

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


__getattr__ = lazy("tfcli", dict.fromkeys(_API, "api"))
