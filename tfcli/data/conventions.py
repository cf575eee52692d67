"""A published family's conventions in its training data: what `prepare --tokenizer-from CHECKPOINT` writes for a
model imported by `tfcli import`, so that fine-tuning trains what transformers would train. Torch-free.

- M2M-100 and NLLB-200 (the checkpoint's LANGUAGE_TOKENS): each source starts with its language's token and each
  target with its own (the decoder's first output; the decoder start before it, </s> after the text), as
  transformers' tokenizers write `tok(src, text_target=tgt)` with `src_lang` and `tgt_lang` set.
- OPUS-MT multilingual and tfcli's own: the target's `>>xx<<` tag first in the source (tfcli/data/languages.py).
- A chat model (an imported language model with a chat template), on parallel data or on conversations (JSONL
  lines with "messages"): each conversation as its template renders it, the loss on the assistant's replies only
  (each reply as the template writes it, its end-of-turn marker included). A pair becomes the conversation that
  `translate` prompts with: the user asks for the translation (tfcli/generate/prompting.py), the target replies.
- Any other language model: the text as it is, for continued pretraining.

A new language: `--add-language CODE[=LIKE]` adds its token (M2M-100's `__xx__`, NLLB's code itself, `>>xx<<`) to
the vocabulary; `train --init-from` grows the embedding and output rows for it, each new row a copy of language
LIKE's, or the mean of the model's rows where no LIKE is named.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tfcli import checkpoint_meta
from tfcli.data.languages import LANGUAGE_TOKENS, check_code, language_tags, tag
from tfcli.errors import ConfigError, InputError, TfcliError

CHAT_FIELD = "messages"  # a JSONL conversation's field


@dataclass
class Convention:
    """How `prepare` writes the data of the checkpoint it reuses the tokenizers of (`of`)."""

    kind: str = "plain"  # tokens (M2M-100/NLLB) | chat | plain (tfcli's own tags where lang_pairs are given)
    tokens: dict = field(default_factory=dict)  # tokens: {language: token}
    text: dict = field(default_factory=dict)  # chat: the checkpoint's meta "text" (template, its tokens)
    checkpoint: dict | None = None  # the config.json of the checkpoint --tokenizer-from names (None: no checkpoint)

    @classmethod
    def of(cls, tokenizer_from: str | None, parallel: bool, text_field: str) -> Convention:
        meta = checkpoint_of(tokenizer_from)
        if meta is None:
            return cls()
        if LANGUAGE_TOKENS in meta:
            return cls("tokens", tokens=dict(meta[LANGUAGE_TOKENS]), checkpoint=meta)
        text = meta.get("text") or {}
        if text.get("chat_template") and (parallel or text_field == CHAT_FIELD):
            return cls("chat", text=text, checkpoint=meta)
        if text_field == CHAT_FIELD:
            raise ConfigError(f"--text-field {CHAT_FIELD}: conversations are written through a chat template, and "
                              f"--tokenizer-from {tokenizer_from} has none")
        return cls(checkpoint=meta)

    @property
    def tokenizer_options(self) -> dict:
        """load_tokenizer's options for the checkpoint's tokenizers (an imported model's own special names, special
        tokens in the text read as those tokens, as its checkpoint reads them)."""
        text = (self.checkpoint or {}).get("text")
        return {"any_names": text is not None, "specials_in_text": bool((text or {}).get("specials_in_text"))}

    def token(self, lang: str) -> str:
        """The token a language is written with in this convention (M2M-100's __xx__, NLLB's code, else >>xx<<)."""
        if self.kind != "tokens":
            return tag(lang)
        m2m = any(t == f"__{code}__" for code, t in self.tokens.items())
        return f"__{lang}__" if m2m else lang


def checkpoint_of(path: str | None) -> dict | None:
    """The config.json of the checkpoint `--tokenizer-from` names (None: a tokenizer file or a prepared dir)."""
    if not path or Path(path).is_file() or (Path(path) / "meta.json").is_file():
        return None
    return checkpoint_meta.read_meta(path)


# --- new languages ---------------------------------------------------------------------------------------------


def new_languages(specs: list[str], conv: Convention, tok, tokenizer_file: str) -> dict[str, dict]:
    """{code: {"token", "like"}} of --add-language CODE[=LIKE]: a language the model lacks, written in its
    convention, initialised from language LIKE's row (one the model has) or the mean (like None). A code whose
    token the vocabulary already holds is refused: an existing language, or another token's name."""
    known = conv.tokens or language_tags(tok, tokenizer_file)
    out = {}
    for spec in specs:
        code, _, like = str(spec).partition("=")
        check_code(code, "--add-language")
        token = conv.token(code)
        if code in known:
            raise ConfigError(f"--add-language {code}: the model has this language already ({token}); drop it")
        if tok.token_to_id(token) is not None:
            raise ConfigError(f"--add-language {code}: its token {token!r} is in the vocabulary already (id "
                              f"{tok.token_to_id(token)}), as another token: choose another code")
        if like and like not in known:
            raise ConfigError(f"--add-language {spec}: the model has no language '{like}' to start {code} from "
                              f"({', '.join(sorted(known)[:12])}{', ...' if len(known) > 12 else ''})")
        if code in out:
            raise ConfigError(f"--add-language {code}: given twice")
        out[code] = {"token": token, "like": (conv.tokens.get(like) or tag(like)) if like else None}
    return out


# --- conversations ---------------------------------------------------------------------------------------------


def pair_messages(src: str, tgt: str, src_lang: str, tgt_lang: str) -> list[dict]:
    """A sentence pair as the conversation `translate` holds with a chat model: the request, then the target."""
    from tfcli.generate.prompting import instruction

    return [instruction(src, src_lang, tgt_lang), {"role": "assistant", "content": tgt}]


def read_conversation(line: str, path: str, lineno: int) -> list[dict]:
    """A JSONL line's conversation, up to its last reply; one line naming the file and line where it has none."""
    from tfcli.generate.chat import read_messages

    where = f"{path}:{lineno}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(path, lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict) or CHAT_FIELD not in record:
        raise InputError(path, lineno, f"no \"{CHAT_FIELD}\" list: each line of a chat dataset is "
                         '{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}')
    try:
        messages = read_messages(json.dumps({CHAT_FIELD: record[CHAT_FIELD]}), where)
    except TfcliError as e:
        raise InputError(path, lineno, str(e).removeprefix(where + ": ")) from None
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise InputError(path, lineno, "a conversation without a reply (no \"assistant\" message): nothing to "
                         "learn from it")
    return messages[: last + 1]


def segments(text: dict, messages: list[dict], where: str) -> list[tuple[str, bool]]:
    """The conversation as its chat template renders it, in pieces: (text, whether an assistant's reply). A reply
    is what the template writes after the generation prompt of the turns before it, to its end of turn."""
    from tfcli.generate.chat import render

    template, tokens = text["chat_template"], text.get("template_tokens") or {}
    out, done = [], ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        asked = render(template, messages[:i], tokens, where)
        answered = render(template, messages[: i + 1], tokens, where, generation=False)
        if not (asked.startswith(done) and answered.startswith(asked)):
            raise TfcliError(f"{where}: the chat template writes earlier turns otherwise once later ones follow "
                             "(it rewrites the history), so the replies cannot be told apart: give one reply a line")
        out += [(asked[len(done):], False), (answered[len(asked):], True)]
        done = answered
    return [(t, r) for t, r in out if t]


def encode_segments(tok, conversations: list[list[tuple[str, bool]]]) -> tuple[list[list[int]], list[list[int]]]:
    """(ids, loss mask) of each conversation: its whole text encoded at once, as transformers encodes a rendered
    template, each token marked 1 where it overlaps a reply (by the tokenizer's character offsets)."""
    texts = ["".join(t for t, _ in c) for c in conversations]
    ids, masks = [], []
    for conv, enc in zip(conversations, tok.encode_batch(texts, add_special_tokens=False)):
        spans, at = [], 0
        for t, reply in conv:
            if reply:
                spans.append((at, at + len(t)))
            at += len(t)
        mask = [int(any(e > a and s < b for a, b in spans)) for s, e in enc.offsets]
        ids.append(list(enc.ids))
        masks.append(mask)
    return ids, masks
