"""Models in and out of tfcli: export to CTranslate2 and Hugging Face `transformers`, import from `transformers`.

Each target's weight mapping lives in one module (`ct2`, `hf`); `export.export` and `hf_import.import_model` are the
entry points the CLI calls (`hf_export` writes a `transformers` directory). The packages they need (ctranslate2,
transformers) are imported only there.
"""
