"""Translating with a decoder-only model: each source text goes into a prompt, and the model's reply is the
translation. Torch-free.

The prompt: the user's own template (`--prompt-template`: a string or a file, with `{src_lang}`, `{tgt_lang}` and
`{text}`) as the whole prompt after the model's start (BOS where its tokenizer adds one); or, for a model with a
chat template, INSTRUCTION as the user's message in it, the assistant's turn opened (the template writes the BOS).
INSTRUCTION is the prompt Unbabel publishes for its Tower models, a Llama-family translator. A decoder-only
translator trained here (on parallel data: tfcli.train.data.PairData) has no text prompt: its source ids follow
the model's start, then the separator it was trained with (the target's language tag, or <s>). The reply ends at any
of the model's end tokens; it is read as one line: its leading and trailing whitespace removed, and cut at its
first line break (a one-line source has a one-line translation; what a model adds after it is commentary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tfcli.errors import ConfigError, TfcliError

INSTRUCTION = "Translate the following text from {src_lang} into {tgt_lang}.\n{src_lang}: {text}\n{tgt_lang}:"
INSTRUCTION_NO_SOURCE = "Translate the following text into {tgt_lang}.\n{text}\n{tgt_lang}:"
FIELDS = ("{src_lang}", "{tgt_lang}", "{text}")

# ISO 639-1 codes -> the English names the instruction writes (any other value is written as given)
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian", "fa": "Persian", "fi": "Finnish",
    "fr": "French", "he": "Hebrew", "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian",
    "is": "Icelandic", "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian",
    "mg": "Malagasy", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sr": "Serbian", "sv": "Swedish", "th": "Thai",
    "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}


def language_name(lang: str) -> str:
    """The English name of an ISO 639-1 code (de -> German), or `lang` as it is."""
    return LANGUAGE_NAMES.get(lang.lower(), lang)


def read_template(value: str | None) -> str | None:
    """--prompt-template's text: the file it names where one exists (one final newline dropped), else the value;
    checked to hold {text}."""
    if value is None:
        return None
    path = Path(value)
    text = value
    if "\n" not in value and len(value) < 4096 and path.is_file():
        try:
            text = path.read_text(encoding="utf-8").removesuffix("\n")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--prompt-template {value}: cannot read ({e})") from None
    if "{text}" not in text:
        raise ConfigError(f"--prompt-template: no {{text}} in {text[:60]!r}: the prompt must say where the source "
                          "text goes (and may say {src_lang} and {tgt_lang})")
    return text


def fill(template: str, text: str, src_lang: str | None, tgt_lang: str | None) -> str:
    """`template` with its three fields replaced (literally: other braces, the text's own included, stay)."""
    values = {"{src_lang}": language_name(src_lang) if src_lang else "",
              "{tgt_lang}": language_name(tgt_lang) if tgt_lang else "", "{text}": text}
    out, i = [], 0
    while i < len(template):
        hit = next((f for f in FIELDS if template.startswith(f, i)), None)
        if hit is None:
            out.append(template[i])
            i += 1
        else:
            out.append(values[hit])
            i += len(hit)
    return "".join(out)


@dataclass(frozen=True)
class Prompter:
    """How a decoder-only checkpoint's translation prompts are written: `template` (the user's, the whole prompt
    after `start`), the model's chat template (`chat_template`, its token strings `tokens`) around INSTRUCTION, or
    a translator trained here: the source after `start`, then a separator (`tags`: its language tags, {}: <s>)."""

    template: str | None
    chat_template: str | None
    tokens: dict = field(default_factory=dict)
    start: tuple[int, ...] = ()
    tags: dict | None = None  # a translator trained here: {language: its tag's id} ({}: one target language)

    @classmethod
    def of(cls, meta: dict, template: str | None, start: list[int], tags: dict | None = None) -> Prompter:
        """For checkpoint `meta` (its config.json) and --prompt-template's text; `start`: the ids the model's
        texts begin with (its BOS, or tfcli's </s>); `tags`: the language tags of its vocabulary."""
        text = meta.get("text") or {}
        if template is None and (meta.get("data") or {}).get("kind") == "parallel":
            return cls(None, None, {}, tuple(start), dict(tags or {}))
        if template is None and not text.get("chat_template"):
            raise TfcliError(f"{meta['dir']}: a language model without a chat template: give --prompt-template "
                             "with {text} (and {src_lang}, {tgt_lang}) to translate with it")
        return cls(template, text.get("chat_template"), dict(text.get("template_tokens") or {}), tuple(start))

    def prompt(self, text: str, src_lang: str | None, tgt_lang: str | None
               ) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
        """(the prompt's text, the ids before it, the ids after it) of one source text."""
        if self.tags is not None:
            from tfcli.data.languages import tag_id
            from tfcli.specials import BOS_ID

            sep = tag_id(self.tags, tgt_lang, "--tgt-lang")
            return text, self.start, (BOS_ID if sep is None else sep,)
        if self.template is not None:
            return fill(self.template, text, src_lang, tgt_lang), self.start, ()
        from tfcli.generate.chat import render

        if not tgt_lang:
            raise TfcliError("translating with a chat model's instruction needs the target language: --tgt-lang "
                             "(or a JSONL line's tgt_lang), or your own --prompt-template")
        return render(self.chat_template, [instruction(text, src_lang, tgt_lang)], self.tokens), (), ()


def instruction(text: str, src_lang: str | None, tgt_lang: str) -> dict:
    """The user's message that asks a chat model for a translation of `text` (and what prepare trains it on)."""
    return {"role": "user", "content": fill(INSTRUCTION if src_lang else INSTRUCTION_NO_SOURCE, text, src_lang,
                                            tgt_lang)}


def reply_line(reply: str) -> str:
    """A reply as a one-line translation: stripped, cut at its first line break."""
    return reply.strip().split("\n", 1)[0].rstrip()
