"""The Transformer. `config.py` is its torch-free leaf (ModelConfig and the presets), which any module
may import; the network is `transformer.py` (build_model) with its parts (attention, layers, positions)."""

from tfcli import lazy

# the entry points of tools beside the library (benchmarks/: docs/architecture.md)
_NAMES = {
    "ModelConfig": "config",
    "preset": "config",
    "build_model": "transformer",
    "count_parameters": "transformer",
}
__all__ = list(_NAMES)
__getattr__ = lazy(__name__, _NAMES)
