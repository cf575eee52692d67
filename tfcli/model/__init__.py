"""The Transformer. `config.py` is its torch-free leaf (ModelConfig and the presets), which any module
may import; the network is `transformer.py` (build_model) with its parts (attention, layers, positions)."""
