"""Chat templates rendered as transformers' `apply_chat_template` renders them (tfcli.generate.chat), on real
templates (tests/data/chat), and their failures as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfcli.errors import TfcliError
from tfcli.generate.chat import messages_of, read_messages, render

TEMPLATES = sorted((Path(__file__).parent / "data" / "chat").glob("*.jinja"))
TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
CONVERSATIONS = [
    [{"role": "user", "content": "Translate to German: the cat sleeps"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why? 🙂 \"quoted\" {{ not code }}"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nb"},
     {"role": "user", "content": "c"}],
]


def transformers_rendering(template: str, conversation: list[dict]) -> str:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "<|im_end|>": 1, "<|endoftext|>": 2}, unk_token="<unk>"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=None, **TOKENS)
    tok.chat_template = template
    return tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_a_real_template_renders_as_transformers_renders_it(path, conversation):
    template = path.read_text(encoding="utf-8")
    messages = CONVERSATIONS[conversation]
    assert render(template, messages, TOKENS) == transformers_rendering(template, messages)


def test_a_prompt_is_the_users_message_after_the_system_one():
    assert messages_of("Hi", "Be brief.") == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"}]
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "Hi"}]
    assert messages_of(own, "Be brief.") == own  # (a conversation's own system message stays)


def test_a_prompt_line_may_be_a_whole_conversation():
    assert read_messages('{"messages": [{"role": "user", "content": "x"}]}', "in:1") == [
        {"role": "user", "content": "x"}]
    assert read_messages('{"not": "a conversation"}', "in:1") == '{"not": "a conversation"}'
    assert read_messages("plain text {", "in:1") == "plain text {"
    with pytest.raises(TfcliError, match=r"^in:3: each message must be"):
        read_messages('{"messages": [{"role": "robot", "content": "x"}]}', "in:3")


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate"),
    ("{% for m in messages %}{{ m.content", "not valid Jinja"),
    ("{{ messages.__class__.__mro__ }}", "cannot render"),  # (the sandbox: no reaching into Python)
])
def test_a_template_that_fails_is_one_line(template, message):
    with pytest.raises(TfcliError, match=message) as e:
        render(template, [{"role": "user", "content": "x"}], TOKENS)
    assert "\n" not in str(e.value)
