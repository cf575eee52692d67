"""How a multilingual model is told its languages. Two conventions:

- Marian's (OPUS-MT's, and tfcli's own models'): `>>fr<<` as the first source token tells one model which language
  to translate into.
- M2M-100's (and NLLB-200's), for models imported from them: the source language's token (`__en__`, `eng_Latn`)
  first in the source, the target language's forced as the first output token (and left out of the output). The
  checkpoint lists those tokens under LANGUAGE_TOKENS; `translate --src-lang` and `--tgt-lang` name them.

tfcli's own tag goes on the source side, not as a forced first target token: the model and the search are
those of a bilingual model, a target prefix stays free for the user's own, and both exports need nothing new (a
CTranslate2 model and a MarianMT model read it as the first source token, as OPUS-MT's multilingual models do, so
an imported OPUS-MT model's tags work as tfcli's). prepare adds the tags to the source vocabulary as special tokens
(never split, never read from the text: `tfcli translate --tgt-lang fr` puts the tag's id in front of the encoded
line). Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from tfcli.checkpoint_meta import tokenizer_path
from tfcli.errors import ConfigError

_CODE = r"[A-Za-z][A-Za-z0-9_-]{0,15}"  # fr, pt_BR, zho_Hans
_TAG = re.compile(r">>(" + _CODE + r")<<")


def tag(lang: str) -> str:
    return f">>{lang}<<"


def check_code(lang: str, what: str) -> str:
    if not re.fullmatch(_CODE, lang or ""):
        raise ConfigError(f"{what}: '{lang}' is not a language code (letters, digits, '_' or '-', from a letter: "
                          "de, pt_BR)")
    return lang


def parse_directions(spec: str | list[str], what: str = "--lang-pairs") -> list[str]:
    """['de-en', 'en-fr'] from 'de-en,en-fr' (or a list of such), each SRC-TGT, without repeats."""
    items = spec.split(",") if isinstance(spec, str) else [x for s in spec for x in str(s).split(",")]
    directions = []
    for item in (x.strip() for x in items):
        src, sep, tgt = item.partition("-") if item.count("-") == 1 else ("", "", "")
        if not sep:
            raise ConfigError(f"{what}: '{item}' is not a language pair: write SRC-TGT, e.g. de-en (codes with '_' "
                              "where they need more, pt_BR-en)")
        check_code(src, what)
        check_code(tgt, what)
        if src == tgt:
            raise ConfigError(f"{what}: '{item}' translates a language into itself")
        if item in directions:
            raise ConfigError(f"{what}: '{item}' is given twice")
        directions.append(item)
    if not directions:
        raise ConfigError(f"{what}: no language pair given")
    return directions


def target_languages(directions: list[str]) -> list[str]:
    """The languages the directions translate into, sorted: the tags a model of them needs (their ids do not depend
    on the order the pairs were given in)."""
    return sorted({d.split("-")[1] for d in directions})


def language_tags(tok, file: str | os.PathLike | None = None) -> dict[str, int]:
    """{language: tag id} of a tokenizer's vocabulary (ours, or an imported OPUS-MT model's): empty for a
    bilingual model. Given the tokenizer.json it was read from, the tags are looked for in the file's text and each
    checked with token_to_id: the vocabulary as a dict takes a fifth of a second at 256k tokens, the text a hundredth
    (a file that escapes < or >, or none, is read through the dict)."""
    text = None
    if file is not None and str(file).endswith(".json"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = Path(file).read_text(encoding="utf-8")
    if text is None or re.search(r"\\u003[ce]", text, re.IGNORECASE):
        return {m.group(1): i for t, i in tok.get_vocab(with_added_tokens=True).items() if (m := _TAG.fullmatch(t))}
    ids = {code: tok.token_to_id(tag(code)) for code in set(_TAG.findall(text))}
    return {code: i for code, i in sorted(ids.items()) if i is not None}


def tag_id(tags: dict[str, int], lang: str | None, where: str) -> int | None:
    """The id to put in front of a source line for `lang`; a one-line error where the model cannot have it."""
    if not tags:
        if lang:
            raise ConfigError(f"{where}: target language '{lang}' given, but the model translates into one language "
                              "only (its source vocabulary has no >>xx<< tags); drop --tgt-lang")
        return None
    if not lang:
        raise ConfigError(f"{where}: the model is multilingual: give the target language with --tgt-lang "
                          f"({', '.join(sorted(tags))})")
    if lang not in tags:
        raise ConfigError(f"{where}: the model does not translate into '{lang}' (it knows: {', '.join(sorted(tags))})")
    return tags[lang]


LANGUAGE_TOKENS = "language_tokens"  # checkpoint config.json key: an M2M-100-style model's {language: token}
_M2M_TOKEN = re.compile(r"__(" + _CODE + r")__")  # M2M-100: __fr__
_NLLB_TOKEN = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # NLLB-200: fra_Latn (a language and its script)


def m2m_language_tokens(tok: dict) -> dict[str, str]:
    """{language: token} of an M2M-100 or NLLB-200 tokenizer.json (the special tokens that name a language)."""
    out = {}
    for added in tok.get("added_tokens", []):
        token = added["content"]
        if m := _M2M_TOKEN.fullmatch(token):
            out[m.group(1)] = token
        elif _NLLB_TOKEN.fullmatch(token):
            out[token] = token
    return out


def language_ids(tok, tokens: dict[str, str]) -> dict[str, int]:
    """{language: id} in a tokenizer of the LANGUAGE_TOKENS of a checkpoint."""
    ids = {lang: tok.token_to_id(t) for lang, t in tokens.items()}
    return {lang: i for lang, i in ids.items() if i is not None}


def language_id(ids: dict[str, int], lang: str | None, where: str, role: str) -> int:
    """An M2M-100-style model's token for `lang` as the `role` ("source" or "target") language; a one-line error
    where it is not given or the model lacks it."""
    flag = "--src-lang" if role == "source" else "--tgt-lang"
    if not lang:
        raise ConfigError(f"{where}: the model needs its {role} language: give it with {flag} "
                          f"({', '.join(sorted(ids)[:12])}{', ...' if len(ids) > 12 else ''})")
    if lang not in ids:
        near = sorted(c for c in ids if c.split("_")[0][:2] == lang.split("_")[0][:2])
        hint = f" (close: {', '.join(near)})" if near else ""
        raise ConfigError(f"{where}: the model has no {role} language '{lang}'{hint}")
    return ids[lang]


class Languages:
    """A loaded translation model's language convention, in one place: which token goes first in a source line,
    which target tokens are forced first in an output (and left out of the translation), and whether sources start
    with a language token (what alignments and attention pictures skip). Three kinds: none (a bilingual model),
    tags (>>fr<<, Marian's: the target's tag first in the source) and tokens (M2M-100/NLLB: the source's token
    first in the source, the target's forced first in the output)."""

    def __init__(self, tok, meta: dict):
        """`tok`: the checkpoint's source tokenizer (None for a language model); `meta` its config.json."""
        self.tokens = language_ids(tok, meta[LANGUAGE_TOKENS]) if LANGUAGE_TOKENS in meta and tok is not None else {}
        self.tags = {} if self.tokens or tok is None else language_tags(tok, tokenizer_path(meta, "src"))
        self.kind = "tokens" if self.tokens else "tags" if self.tags else "none"

    @property
    def leads(self) -> bool:
        """Whether every source starts with a language token."""
        return self.kind != "none"

    @property
    def forces(self) -> int:
        """How many target tokens are forced first in every output (and left out of the translation)."""
        return 1 if self.kind == "tokens" else 0

    def check(self, src_lang: str | None, tgt_lang: str | None) -> None:
        """The command's own --src-lang/--tgt-lang, checked once before any line is read (a line may give its own,
        so a missing one is an error only where a line lacks it)."""
        if self.kind == "tokens":
            for role, lang in (("source", src_lang), ("target", tgt_lang)):
                if lang is not None:
                    language_id(self.tokens, lang, "--src-lang" if role == "source" else "--tgt-lang", role)
        elif tgt_lang is not None:
            tag_id(self.tags, tgt_lang, "--tgt-lang")

    def lead(self, src_lang: str | None, tgt_lang: str | None, where: str) -> int | None:
        """The id that goes first in a source line (None: no token)."""
        if self.kind == "tokens":
            return language_id(self.tokens, src_lang, where, "source")
        return tag_id(self.tags, tgt_lang, where)

    def forced(self, tgt_lang: str | None, where: str) -> list[int]:
        """The target ids every output starts with ([] for none), not part of the translation."""
        return [language_id(self.tokens, tgt_lang, where, "target")] if self.kind == "tokens" else []


_NOT_LANGUAGES = {"txt", "tsv", "csv", "gz", "xz", "bz2", "zst", "json", "raw", "tok", "bpe", "src", "tgt"}


def named_source_language(src: str | None, src_field: str | None, directions: list[str]) -> str | None:
    """The source language a single pair's data names: the last suffix of its source file (train.de, with any
    compression suffix before it dropped) or of its dataset field (translation.de); None for several directions
    or where no code is named (what translate's sentence splitter then uses: generic rules)."""
    if directions:
        return None
    for name in (src_field, src):
        if not name:
            continue
        parts = [p.lower() for p in str(name).replace("/", ".").split(".")[1:]]
        while parts and parts[-1] in ("gz", "xz", "bz2", "zst"):
            parts.pop()
        if parts and re.fullmatch(r"[a-z]{2,3}", parts[-1]) and parts[-1] not in _NOT_LANGUAGES:
            return parts[-1]
    return None


def two_letter_code(lang: str) -> str:
    """ISO 639-1's code of a language named by any of the codes models use (fr, fr-CA, pt_BR, fra, fre, fra_Latn,
    arb_Arab), for tools keyed by the two-letter codes (the sentence splitter); a code with no two-letter form
    (yue_Hant -> yue) is kept, lower-cased, without its region or script."""
    code = lang.split("_")[0].split("-")[0].lower()
    return _ISO_639_1.get(code, code)


# ISO 639-3 and 639-2's codes (bibliographic too) with an ISO 639-1 code, from Debian's iso-codes tables; and the
# individual languages NLLB-200 names, as their macrolanguage's (arb: Standard Arabic -> ar)
_ISO_639_1 = dict(pair.split(":") for pair in (  # ISO 639-2/3 (and NLLB's individual languages) -> ISO 639-1
    "aar:aa abk:ab afr:af aka:ak alb:sq als:sq amh:am ara:ar arb:ar arg:an arm:hy asm:as ava:av ave:ae aym:ay azb:az "
    "aze:az azj:az bak:ba bam:bm baq:eu bel:be ben:bn bih:bh bis:bi bod:bo bos:bs bre:br bul:bg bur:my cat:ca ces:cs "
    "cha:ch che:ce chi:zh chu:cu chv:cv ckb:ku cmn:zh cor:kw cos:co cre:cr cym:cy cze:cs dan:da deu:de div:dv dut:nl "
    "dzo:dz ekk:et ell:el eng:en epo:eo est:et eus:eu ewe:ee fao:fo fas:fa fij:fj fin:fi fra:fr fre:fr fry:fy ful:ff "
    "fuv:ff gaz:om geo:ka ger:de gla:gd gle:ga glg:gl glv:gv gre:el grn:gn guj:gu hat:ht hau:ha hbs:sh heb:he her:hz "
    "hin:hi hmo:ho hrv:hr hun:hu hye:hy ibo:ig ice:is ido:io iii:ii iku:iu ile:ie ina:ia ind:id ipk:ik isl:is ita:it "
    "jav:jv jpn:ja kal:kl kan:kn kas:ks kat:ka kau:kr kaz:kk khk:mn khm:km kik:ki kin:rw kir:ky kmr:ku knc:kr kom:kv "
    "kon:kg kor:ko kua:kj kur:ku lao:lo lat:la lav:lv lim:li lin:ln lit:lt ltz:lb lub:lu lug:lg lvs:lv mac:mk mah:mh "
    "mal:ml mao:mi mar:mr may:ms mkd:mk mlg:mg mlt:mt mon:mn mri:mi msa:ms mya:my nau:na nav:nv nbl:nr nde:nd ndo:ng "
    "nep:ne nld:nl nno:nn nob:nb nor:no npi:ne nya:ny oci:oc oji:oj ori:or orm:om ory:or oss:os pan:pa pbt:ps per:fa "
    "pes:fa pli:pi plt:mg pol:pl por:pt prs:fa pus:ps que:qu quy:qu roh:rm ron:ro rum:ro run:rn rus:ru sag:sg san:sa "
    "sin:si slk:sk slo:sk slv:sl sme:se smo:sm sna:sn snd:sd som:so sot:st spa:es sqi:sq srd:sc srp:sr ssw:ss sun:su "
    "swa:sw swe:sv swh:sw tah:ty tam:ta tat:tt tel:te tgk:tg tgl:tl tha:th tib:bo tir:ti ton:to tsn:tn tso:ts tuk:tk "
    "tur:tr twi:tw uig:ug ukr:uk urd:ur uzb:uz uzn:uz ven:ve vie:vi vol:vo wel:cy wln:wa wol:wo xho:xh ydd:yi yid:yi "
    "yor:yo zha:za zho:zh zsm:ms zul:zu"
).split())
