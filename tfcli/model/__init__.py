"""The Transformer: attention, layers, encoder/decoder, and the two model types.

The config (tfcli/model/config.py) is imported eagerly and is torch-free, so that the command line's help and the
config registry can read its defaults; the network (transformer.py) loads on first use."""

from tfcli.model.config import BOS_ID, EOS_ID, PAD_ID, PRESETS, SPECIAL_TOKENS, UNK_ID, ModelConfig, preset

_NETWORK = ("DecoderOnlyLM", "EncoderDecoder", "build_model", "count_parameters")

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "SPECIAL_TOKENS", "PRESETS", "ModelConfig", "preset", *_NETWORK]


def __getattr__(name: str):
    if name in _NETWORK:
        from tfcli.model import transformer

        return getattr(transformer, name)
    raise AttributeError(f"module 'tfcli.model' has no attribute {name!r}")
