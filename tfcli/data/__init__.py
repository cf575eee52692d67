"""Data: tokenizers (`tokenizer`), `prepare` and the prepared directory it writes (`prepared`), batches."""

from tfcli import lazy

# the entry points of tools beside the library (benchmarks/: docs/architecture.md)
_NAMES = {
    "load_tokenizer": "tokenizer",
    "encode_batch": "tokenizer",
    "decode_batch": "tokenizer",
    "source_ids": "batching",
    "pad": "batching",
    "token_batches": "batching",
    "collate_seq2seq": "batching",
    "PreparedData": "prepared",
}
__all__ = list(_NAMES)
__getattr__ = lazy(__name__, _NAMES)
