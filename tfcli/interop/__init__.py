"""Models in and out of tfcli: export to CTranslate2 and Hugging Face `transformers`, import from `transformers`.

Each target's weight mapping lives in one module (`ct2`, `hf`); `export` (exporter.py) and `import_model`
(hf_import.py) are the entry points (`hf_export` writes a `transformers` directory). The packages they need (ctranslate2,
transformers) are imported only there.
"""

from tfcli import lazy

# for the CLI and for tools beside the library (benchmarks/: docs/architecture.md)
_NAMES = {
    "export": "exporter",
    "import_model": "hf_import",
}
__all__ = list(_NAMES)
__getattr__ = lazy(__name__, _NAMES)
