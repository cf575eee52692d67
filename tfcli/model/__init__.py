"""The Transformer: attention, layers, encoder/decoder, and the two model types."""

from tfcli.model.config import BOS_ID, EOS_ID, PAD_ID, PRESETS, SPECIAL_TOKENS, UNK_ID, ModelConfig, preset
from tfcli.model.transformer import DecoderOnlyLM, EncoderDecoder, build_model, count_parameters

__all__ = [
    "BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "SPECIAL_TOKENS", "PRESETS", "ModelConfig", "preset",
    "DecoderOnlyLM", "EncoderDecoder", "build_model", "count_parameters",
]
