"""Just enough CEL lexing to know which names an expression reads, and where a placeholder ends.

The cel package lists every identifier an expression uses (`Program.variables()`), including
the ones a comprehension binds (`x` in `items.map(x, x.total)`) and type names (`int`). Those
are not state keys: the workflow's data-flow check would ask for a key `x` that no node writes.
Scanning the tokens for the macros that bind names tells the two apart; the caller keeps only
names the package also lists, so a name this scan gets wrong can only be left out, never
invented.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass

# `//` comments end at a newline, or before `}}` (a placeholder's end wins over a comment).
_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//(?:(?!\}\})[^\n])*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?(?:'''|\"\"\"|'|"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_OPENERS = {"(": ")", "[": "]", "{": "}"}

# Macro name -> (how many leading arguments it binds for a given argument count,
# the first argument the bound names are visible in). Receiver-style macros only.
_BINDING_MACROS: dict[str, tuple[dict[int, int], int | None]] = {
    "all": ({2: 1, 3: 2}, None),
    "exists": ({2: 1, 3: 2}, None),
    "exists_one": ({2: 1, 3: 2}, None),
    "existsOne": ({2: 1, 3: 2}, None),
    "map": ({2: 1, 3: 1}, None),
    "filter": ({2: 1}, None),
    "transformList": ({3: 2, 4: 2}, None),
    "transformMap": ({3: 2, 4: 2}, None),
    "transformMapEntry": ({3: 2, 4: 2}, None),
    "sortBy": ({2: 1}, None),
    # cel.bind(name, init, body): `init` is evaluated outside the binding.
    "bind": ({3: 1}, 2),
}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    start: int
    end: int


def _string_end(text: str, start: int, opening: str) -> int:
    """The index just past a string literal's closing quote (the text's end if unclosed)."""
    quote = opening.lstrip("rRbB")
    raw = "r" in opening[: len(opening) - len(quote)].lower()
    i = start + len(opening)
    while i < len(text):
        if text.startswith(quote, i):
            return i + len(quote)
        i += 2 if text[i] == "\\" and not raw else 1
    return len(text)


def _tokens(text: str, start: int = 0) -> Iterator[_Token]:
    """The tokens of `text` from `start`, whitespace and comments included."""
    pos = start
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        assert match is not None and match.lastgroup is not None  # `.` matches any character
        kind = match.lastgroup
        end = _string_end(text, pos, match.group()) if kind == "string" else match.end()
        yield _Token(kind, text[pos:end], pos, end)
        pos = end


def _closers(tokens: list[_Token]) -> dict[int, int]:
    """Each opening bracket's index -> its closing bracket's index (unmatched ones left out)."""
    closers: dict[int, int] = {}
    stack: list[int] = []
    for i, token in enumerate(tokens):
        if token.text in _OPENERS:
            stack.append(i)
        elif stack and token.text == _OPENERS[tokens[stack[-1]].text]:
            closers[stack.pop()] = i
    return closers


def _arguments(
    tokens: list[_Token], open_: int, close: int, closers: dict[int, int]
) -> list[range]:
    """The token ranges of a call's arguments, split at the commas of its own level."""
    arguments: list[range] = []
    start = i = open_ + 1
    while i < close:
        if i in closers:
            i = closers[i] + 1
            continue
        if tokens[i].text == ",":
            arguments.append(range(start, i))
            start = i + 1
        i += 1
    if start < close or arguments:
        arguments.append(range(start, close))
    return arguments


@dataclass(frozen=True)
class _Binding:
    names: frozenset[str]
    declarations: frozenset[int]  # the binding identifiers' own token indices
    visible: range  # token indices the names are bound in


def _binding(tokens: list[_Token], i: int, closers: dict[int, int]) -> _Binding | None:
    """The names a macro call whose `(` is token `i` binds, if it is one."""
    if i < 2 or tokens[i - 2].text != "." or i not in closers:
        return None
    macro = _BINDING_MACROS.get(tokens[i - 1].text)
    if macro is None:
        return None
    counts, visible_from = macro
    arguments = _arguments(tokens, i, closers[i], closers)
    count = counts.get(len(arguments), 0)
    binders = [a for a in arguments[:count] if len(a) == 1 and tokens[a[0]].kind == "ident"]
    if not count or len(binders) != count:
        return None
    first_visible = arguments[visible_from if visible_from is not None else count].start
    return _Binding(
        names=frozenset(tokens[a[0]].text for a in binders),
        declarations=frozenset(a[0] for a in binders),
        visible=range(first_visible, closers[i]),
    )


def free_names(source: str) -> frozenset[str]:
    """The identifiers `source` reads from its scope: not fields, functions or bound names."""
    tokens = [t for t in _tokens(source) if t.kind != "space"]
    closers = _closers(tokens)
    bindings = [b for i in closers if (b := _binding(tokens, i, closers)) is not None]
    declared = frozenset().union(*(b.declarations for b in bindings))
    names: set[str] = set()
    for i, token in enumerate(tokens):
        if token.kind != "ident" or i in declared:
            continue
        if i > 0 and tokens[i - 1].text == ".":
            continue  # a field or a method
        if i + 1 < len(tokens) and tokens[i + 1].text == "(":
            continue  # a function
        if any(token.text in b.names and i in b.visible for b in bindings):
            continue
        names.add(token.text)
    return frozenset(names)


def placeholder_end(text: str, start: int) -> int | None:
    """Where the `}}` closing a placeholder whose CEL starts at `start` is (None: unclosed).

    Braces of CEL map literals and `}}` inside string literals do not close it:
    `{{ {"a": {"b": 1}} }}` is one placeholder.
    """
    depth = 0
    for token in _tokens(text, start):
        if depth == 0 and text.startswith("}}", token.start):
            return token.start
        if token.text == "{":
            depth += 1
        elif token.text == "}" and depth:
            depth -= 1
    return None


@dataclass(frozen=True)
class Loop:
    """One comprehension macro (`items.map(x, ...)`): the tokens of its body, the loops in it.

    `accumulates`: the macro builds a list (map, filter), which cel 0.10 copies on every
    step, so its own cost grows with the square of the list's length.
    """

    macro: str
    accumulates: bool
    body_tokens: int
    body_reads: int  # names from the scope its body reads: cel copies the value on each read
    inner: tuple["Loop", ...]

    @property
    def depth(self) -> int:
        return 1 + max((loop.depth for loop in self.inner), default=0)


_ACCUMULATING = frozenset({"map", "filter", "transformList", "transformMap", "sortBy"})


@dataclass(frozen=True)
class LoopScan:
    loops: tuple[Loop, ...]  # the top-level ones, each with those nested in its body
    tokens: int
    joins: int  # `+`: each may join two lists, so a loop may range over a longer one
    written: int  # no list or map written in the expression has more items than this (commas + 1)


def loops(source: str) -> LoopScan:
    """The comprehensions of `source` and what bounds the lists they may range over."""
    tokens = [t for t in _tokens(source) if t.kind != "space"]
    closers = _closers(tokens)
    found = sorted(
        (i, b, tokens[i - 1].text)
        for i in closers
        if (b := _binding(tokens, i, closers)) is not None
    )
    bound = frozenset().union(*(b.names for _, b, _ in found)) | {"true", "false", "null"}
    reads = [
        i
        for i, token in enumerate(tokens)
        if token.kind == "ident"
        and token.text not in bound
        and not (i > 0 and tokens[i - 1].text == ".")
        and not (i + 1 < len(tokens) and tokens[i + 1].text == "(")
    ]

    def nested(inside: range | None) -> tuple[Loop, ...]:
        # A loop belongs to the innermost loop whose body holds its `(`.
        result: list[Loop] = []
        for i, binding, macro in found:
            if inside is not None and i not in inside:
                continue
            holders = [b for j, b, _ in found if j != i and i in b.visible]
            if inside is None and holders:
                continue
            if inside is not None and any(
                h.visible.start > inside.start and h.visible.stop <= inside.stop for h in holders
            ):
                continue
            result.append(
                Loop(
                    macro=macro,
                    accumulates=macro in _ACCUMULATING,
                    body_tokens=len(binding.visible),
                    body_reads=sum(1 for r in reads if r in binding.visible),
                    inner=nested(binding.visible),
                )
            )
        return tuple(result)

    return LoopScan(
        loops=nested(None),
        tokens=len(tokens),
        joins=sum(1 for t in tokens if t.text == "+"),
        written=1 + sum(1 for t in tokens if t.text == ","),
    )
