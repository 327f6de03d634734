"""Tool calls as text, for a model whose chat template knows no tools: the tools described in
the system prompt, tool turns written as plain messages, the GBNF grammar a call is generated
under, the call parsed back, and the mark held back from speech. No model needed."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from agent.errors import ConfigError
from agent.tools import ToolCall

TOOL_MARK = "<tool_call>"
TOOL_END = "</tool_call>"
MAX_CALLS = 3  # calls one request may make
_ENVELOPE = re.compile(r'\{"name": "([A-Za-z0-9_-]+)", "arguments":')
_call_ids = itertools.count(1)


def tools_addendum(specs: list[dict[str, Any]]) -> str:
    """What the system prompt says about the tools: each tool as one JSON line, and the
    format of a call and of a result. Rendered the same for the same tools, so every request
    of a conversation begins with the same tokens (the KV cache keeps them)."""
    lines = ["", "", "# Tools", "You can call these tools:"]
    for spec in specs:
        fn = spec["function"]
        lines.append(json.dumps({"name": fn["name"], "description": fn.get("description", ""),
                                 "parameters": fn.get("parameters") or {}},
                                ensure_ascii=False, separators=(",", ":")))
    lines.append(f'To call a tool, write {TOOL_MARK}{{"name": "<tool name>", "arguments": '
                 f"{{<its arguments>}}}}{TOOL_END} and nothing after it. Its result comes "
                 'back as <tool_response name="<tool name>">the result</tool_response>.')
    return "\n".join(lines)


def envelope(name: str) -> str:
    """How a call to ``name`` begins, after the mark; a space, its arguments and ``}``
    follow. (It ends before the space: a prompt cut after a space tokenizes otherwise than
    the whole call written again, and the cache would stop there.)"""
    return f'{{"name": "{name}", "arguments":'


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (and as the history shows it again)."""
    return f"{TOOL_MARK}{envelope(name)} {arguments.strip() or '{}'}}}{TOOL_END}"


def tool_turns_as_text(
    messages: list[dict[str, Any]], specs: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """``messages`` as a template without tool support renders them: the tools described at
    the end of the system prompt, an assistant's calls written out after its text, and the
    results of consecutive tool messages as one user message. ``messages`` itself when
    there is nothing to change."""
    if not specs and not any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
        return messages
    out: list[dict[str, Any]] = []
    results: list[str] = []
    for m in messages:
        if m["role"] == "tool":
            results.append(f'<tool_response name="{m.get("name", "")}">\n{m["content"]}\n'
                           "</tool_response>")
            continue
        if results:
            out.append({"role": "user", "content": "\n".join(results)})
            results = []
        if m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], c["function"]["arguments"])
                              for c in m["tool_calls"])
            text = m["content"] or ""
            out.append({"role": m["role"], "content": f"{text}\n{calls}" if text else calls})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if results:
        out.append({"role": "user", "content": "\n".join(results)})
    if specs:
        addendum = tools_addendum(specs)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + addendum}
        else:
            out.insert(0, {"role": "system", "content": addendum.lstrip()})
    return out


def call_grammar(specs: list[dict[str, Any]], only: str | None = None, calls: int = MAX_CALLS,
                 named: bool = False) -> str:
    """GBNF for what follows a :data:`TOOL_MARK`: one to ``calls`` calls, each
    ``{"name": "<a tool>", "arguments": <JSON its parameters' schema allows>}`` then
    :data:`TOOL_END`; ``only`` keeps to one tool, and ``named`` (one call to ``only``) starts
    after its :func:`envelope`, which the prompt then ends with: the model writes only the
    arguments. The envelope is fixed text, so the history writes a call again token for
    token."""
    from llama_cpp.llama_grammar import SchemaConverter

    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    alternatives = []
    for i, spec in enumerate(specs):
        fn = spec["function"]
        if only is not None and fn["name"] != only:
            continue
        params = fn.get("parameters") or {"type": "object"}
        rule = conv.visit(conv.resolve_refs(json.loads(json.dumps(params)), f"tool-{i}"),
                          f"args-{i}")
        head = "" if named else conv._format_literal(envelope(fn["name"])) + " "
        alternatives.append(f'{head}" " {rule} "}}"')
    if not alternatives:
        raise ConfigError(f"tool_choice names {only!r}, which is not among the tools offered")
    if named and (only is None or calls != 1):
        raise ValueError("a named grammar is for one call to the tool named")
    more = (f' ("\\n" {conv._format_literal(TOOL_MARK)} call "{TOOL_END}"){{0,{calls - 1}}}'
            if calls > 1 else "")
    return (f"{conv.format_grammar()}\ncall ::= {' | '.join(alternatives)}\n"
            f'root ::= call "{TOOL_END}"{more}\n')


def parse_calls(text: str) -> list[ToolCall]:
    """The calls in what the model wrote after a :data:`TOOL_MARK` (the grammar's output). A
    call cut short by the token budget keeps the arguments it has, so the runner can tell the
    model they are incomplete."""
    calls = []
    pieces = text.split(TOOL_END)
    for n, piece in enumerate(pieces):
        body = piece.strip()
        if body.startswith(TOOL_MARK):
            body = body[len(TOOL_MARK):]
        m = _ENVELOPE.match(body)
        if m is None:
            continue
        args = body[m.end():]
        if n < len(pieces) - 1:  # closed by TOOL_END: the envelope's "}" ends it
            args = args.rstrip()[:-1]
        calls.append(ToolCall(f"call_{next(_call_ids)}", m[1], args.strip()))
    return calls


class CallWatch:
    """Watches streamed text for :data:`TOOL_MARK`: :meth:`feed` returns what may be said now,
    holding back an end that could be the mark's beginning; once the mark is seen
    ``found`` is set and ``text`` holds everything before it."""

    def __init__(self) -> None:
        self.found = False
        self.text = ""  # said so far (the text before the mark, once found)
        self._held = ""

    def feed(self, text: str) -> str:
        buf = self._held + text
        at = buf.find(TOOL_MARK)
        if at >= 0:
            self.found = True
            self._held = ""
            self.text += buf[:at]
            return buf[:at]
        keep = next((k for k in range(min(len(TOOL_MARK) - 1, len(buf)), 0, -1)
                     if buf.endswith(TOOL_MARK[:k])), 0)
        out, self._held = buf[: len(buf) - keep], buf[len(buf) - keep:]
        self.text += out
        return out

    def flush(self) -> str:
        """The end held back, once the text is over without the mark."""
        out, self._held = self._held, ""
        self.text += out
        return out
