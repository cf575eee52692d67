"""tfcli: a command-line Transformer toolkit."""

__version__ = "0.1.0"
