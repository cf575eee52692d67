"""Chat prompts: a conversation rendered with the model's own chat template, as transformers' `apply_chat_template`
renders it (the same Jinja environment: sandboxed, trim_blocks and lstrip_blocks, loop controls, its `tojson`,
`raise_exception` and `strftime_now`; the tokenizer's special-token strings as variables; the generation prompt
added). Torch-free.

A template is code from the model's publisher: it runs in Jinja's immutable sandbox, never as Python."""

from __future__ import annotations

import functools
import json
from datetime import datetime

from tfcli.errors import TfcliError

ROLES = ("system", "user", "assistant", "tool")


def messages_of(prompt, system: str | None = None) -> list[dict]:
    """The conversation of one prompt: a text is the user's message, a list is the messages as they are
    ({"role", "content"} each); `system`, where given, is said first (unless the conversation has its own)."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [dict(m) for m in prompt]
    if system is not None and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def read_messages(line: str, where: str) -> list[dict] | str:
    """A prompt line: a JSON object with a "messages" list ({"role": ..., "content": ...} each) is that
    conversation; any other line is the user's message. A malformed conversation: one line naming `where`."""
    if not line.lstrip().startswith("{"):
        return line
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(record, dict) or "messages" not in record:
        return line
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise TfcliError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise TfcliError(f"{where}: each message must be {{\"role\": one of {', '.join(ROLES)}, \"content\": "
                             f"text}}, got {json.dumps(m, ensure_ascii=False)[:80]}")
    return messages


def render(template: str, messages: list[dict], tokens: dict[str, str], where: str = "chat template",
           generation: bool = True) -> str:
    """The conversation as the template writes it, with the generation prompt after it (the assistant's turn
    opened) unless `generation` is False. `tokens`: the tokenizer's special-token strings (bos_token, eos_token,
    ...), which templates read."""
    try:
        return _compiled(template).render(messages=messages, tools=None, documents=None,
                                          add_generation_prompt=generation, **tokens)
    except TfcliError:
        raise
    except Exception as e:  # jinja2's TemplateError and whatever a template's own code raises
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TfcliError(f"{where}: cannot render the conversation ({type(e).__name__}: {first})") from None


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TfcliError("chat templates need jinja2: pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (marks the assistant's tokens for training): its body as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TfcliError(f"chat template: not valid Jinja (line {e.lineno}: {e.message})") from None
