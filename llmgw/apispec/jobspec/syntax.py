"""HCL2 native syntax: a scanner and recursive-descent parser that keep every position.

Owns turning jobspec text into a tree of :class:`Body`, :class:`Attribute` and
:class:`Block` whose expressions are :mod:`.expressions` nodes, with HCL's syntax
errors (``Attribute redefined``, ``Unterminated template string``, ``Invalid
escape sequence``, ``Missing newline after argument``...) at their line and column.

Why hand-written rather than python-hcl2: python-hcl2 (lark) keeps ``${...}``
text but neither unescapes strings nor parses interpolations as expressions,
has no positions on values, and takes milliseconds for a small file; llmgw parses
thousands of rendered jobs, and the stand-in must fail where Nomad fails
(e.g. ``${FOO:-x}`` in a heredoc is a syntax error in jobspec2).

Must not: evaluate expressions or know about Nomad's job schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmgw.apispec.jobspec.diagnostics import SyntaxProblem
from llmgw.apispec.jobspec.expressions import (
    Binary,
    Conditional,
    Expr,
    ForDirective,
    ForExpr,
    FunctionCall,
    GetAttr,
    IfDirective,
    Index,
    Interpolation,
    Literal,
    ObjectCons,
    Parenthesized,
    Part,
    Postfix,
    Splat,
    Step,
    Template,
    Traversal,
    TupleCons,
    Unary,
    parse_number,
)


@dataclass(slots=True)
class Attribute:
    name: str
    expr: Expr
    name_start: int


@dataclass(slots=True)
class Block:
    type: str
    labels: list[str]
    label_starts: list[int]
    type_start: int
    open_brace: int
    body: Body


@dataclass(slots=True)
class Body:
    """A block's content in source order; ``open_brace`` is where HCL reports missing items."""

    attributes: dict[str, Attribute] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    open_brace: int = 0


# ------------------------------------------------------------------ scanner

_SKIP_NL = re.compile(r"(?:[ \t\r\n]+|#[^\n]*|//[^\n]*|/\*.*?\*/)*", re.S)
_SKIP = re.compile(r"(?:[ \t\r]+|#[^\n]*|//[^\n]*|/\*.*?\*/)*", re.S)
_PUNCT = re.compile(r"=>|==|!=|<=|>=|&&|\|\||\.\.\.|<<-?|[{}\[\]()=,.:?!<>+\-*/%~\"\n]")
_LEXEME = (
    # a quoted string without escapes or template sequences is one token (the common case)
    r'(?:"(?P<s>[^"\\$%\n]*)"'
    r"|(?P<i>[^\W\d][\w-]*)|(?P<n>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<p>=>|==|!=|<=|>=|&&|\|\||\.\.\.|<<-?|[{}\[\]()=,.:?!<>+\-*%~\"\n]|/(?![*/])))"
)
# one match per token: skip blanks and comments, then the token (newlines are tokens or blanks)
_TOKEN = re.compile(r"(?:[ \t\r]+|#[^\n]*|//[^\n]*|/\*.*?\*/)*" + _LEXEME, re.S)
_TOKEN_NL = re.compile(r"(?:[ \t\r\n]+|#[^\n]*|//[^\n]*|/\*.*?\*/)*" + _LEXEME, re.S)
_KIND = {"i": "ident", "n": "number", "s": "string"}
_HEREDOC_START = re.compile(r"<<(-?)([^\W\d][\w-]*)[ \t]*\r?\n")
_QUOTED_LIT = re.compile(r'[^"\\$%\n]+')
_HEREDOC_LIT = re.compile(r"[^$%\n]+")

IDENT = "ident"
NUMBER = "number"
STRING = "string"  # a plain quoted string; its text is the content
EOF = "eof"


class Tok:
    __slots__ = ("end", "kind", "start", "text")

    def __init__(self, kind: str, text: str, start: int, end: int) -> None:
        self.kind = kind
        self.text = text
        self.start = start
        self.end = end


_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}

_ENDS_EXPRESSION = frozenset({"\n", ",", "]", "}", ")", EOF, ":", "=>", "..."})

_PRECEDENCE: dict[str, int] = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 4,
    ">": 4,
    "<=": 4,
    ">=": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}


class Parser:
    """One parse of one source text. Newlines matter in bodies and object constructors only."""

    __slots__ = ("_cache", "_cache_nl", "_cache_pos", "filename", "nl", "pos", "src")

    def __init__(self, src: str, filename: str = "") -> None:
        self.src = src
        self.filename = filename
        self.pos = 0
        self.nl = True  # newlines are tokens (bodies); False inside () [] ${}
        self._cache: Tok | None = None
        self._cache_pos = -1
        self._cache_nl = True

    # -- tokens

    def peek(self) -> Tok:
        c = self._cache
        if c is not None and self._cache_pos == self.pos and self._cache_nl == self.nl:
            return c
        m = (_TOKEN if self.nl else _TOKEN_NL).match(self.src, self.pos)
        if m is not None:
            group = m.lastgroup
            text = m.group(group)  # type: ignore[arg-type]
            start = m.start(group)  # type: ignore[arg-type]
            if group == "s":
                start -= 1  # the opening quote
            tok = Tok(_KIND.get(group, text), text, start, m.end())  # type: ignore[arg-type]
        else:
            tok = self._scan()
        self._cache = tok
        self._cache_pos = self.pos
        self._cache_nl = self.nl
        return tok

    def _scan(self) -> Tok:
        """The slow path: end of file, or a character that starts no token."""
        src = self.src
        pos = (_SKIP_NL if not self.nl else _SKIP).match(src, self.pos).end()  # type: ignore[union-attr]
        if pos >= len(src):
            return Tok(EOF, "", len(src), len(src))
        ch = src[pos]
        if ch == "/" and src.startswith("/*", pos):
            raise SyntaxProblem(pos, "Unterminated comment", "There is no closing marker for this comment.")
        m = _PUNCT.match(src, pos)
        if m is not None:
            return Tok(m.group(), m.group(), pos, m.end())
        if ch == "'":
            raise SyntaxProblem(
                pos,
                "Invalid character",
                'Single quotes are not valid. Use double quotes (") to enclose strings.',
            )
        raise SyntaxProblem(pos, "Invalid character", "This character is not used within the language.")

    def next(self) -> Tok:
        tok = self.peek()
        self.pos = tok.end
        return tok

    def expect(self, kind: str, summary: str, detail: str) -> Tok:
        tok = self.peek()
        if tok.kind != kind:
            raise SyntaxProblem(tok.start, summary, detail)
        return self.next()

    # -- bodies

    def parse_file(self) -> Body:
        body = Body(open_brace=0)
        self._body_items(body, top=True)
        return body

    def _body_items(self, body: Body, *, top: bool) -> None:
        while True:
            tok = self.peek()
            if tok.kind == "\n":
                self.next()
                continue
            if tok.kind == EOF:
                if top:
                    return
                raise SyntaxProblem(
                    body.open_brace,
                    "Unclosed configuration block",
                    "There is no closing brace for this block before the end of the file. "
                    "This may be caused by incorrect brace nesting elsewhere in this file.",
                )
            if tok.kind == "}":
                if top:
                    raise SyntaxProblem(
                        tok.start,
                        "Argument or block definition required",
                        "An argument or block definition is required here.",
                    )
                return
            if tok.kind != IDENT:
                detail = "An argument or block definition is required here."
                if tok.kind == "=":
                    detail += " To set an argument, give its name before the equals sign."
                raise SyntaxProblem(tok.start, "Argument or block definition required", detail)
            self._body_item(body)

    def _body_item(self, body: Body) -> None:
        name_tok = self.next()
        after = self.peek()
        if after.kind == "=":
            self.next()
            expr = self.expression()
            end = self.peek()
            if end.kind not in ("\n", EOF, "}"):
                raise SyntaxProblem(
                    end.start,
                    "Missing newline after argument",
                    "An argument definition must end with a newline.",
                )
            prev = body.attributes.get(name_tok.text)
            if prev is not None:
                line_hint = self._where(prev.name_start)
                raise SyntaxProblem(
                    name_tok.start,
                    "Attribute redefined",
                    f'The argument "{name_tok.text}" was already set at {line_hint}. '
                    "Each argument may be set only once.",
                )
            body.attributes[name_tok.text] = Attribute(name_tok.text, expr, name_tok.start)
            return
        labels: list[str] = []
        label_starts: list[int] = []
        while True:
            tok = self.peek()
            if tok.kind == IDENT:
                self.next()
                labels.append(tok.text)
                label_starts.append(tok.start)
                continue
            if tok.kind == STRING:
                self.next()
                labels.append(tok.text)
                label_starts.append(tok.start)
                continue
            if tok.kind == '"':
                self.next()
                tmpl = self._quoted_template(tok.start)
                text = tmpl.static_text()
                if text is None:
                    raise SyntaxProblem(
                        tok.start,
                        "Invalid string literal",
                        "Template sequences are not allowed in this string. "
                        'To include a literal "$", double it (as "$$") to escape it.',
                    )
                labels.append(text)
                label_starts.append(tok.start)
                continue
            break
        tok = self.peek()
        if tok.kind != "{":
            if not labels and tok.kind in ("\n", EOF):
                raise SyntaxProblem(
                    tok.start,
                    "Invalid argument or block definition",
                    'An identifier must be followed by an equals sign ("=") to set an argument, '
                    'or by a block label or an opening brace ("{") to define a block.',
                )
            raise SyntaxProblem(
                tok.start,
                "Invalid block definition",
                'Either a quoted string block label or an opening brace ("{") is expected here.',
            )
        self.next()
        inner = Body(open_brace=tok.start)
        after_brace = self.peek()
        if after_brace.kind == "}":
            self.next()
        elif after_brace.kind == "\n":
            self._body_items(inner, top=False)
            self.next()  # the closing brace
        else:
            # a single-line block: one argument at most, then the closing brace
            item = self.peek()
            if item.kind != IDENT:
                raise SyntaxProblem(
                    item.start,
                    "Argument or block definition required",
                    "An argument or block definition is required here.",
                )
            self._body_item(inner)
            if inner.blocks:
                raise SyntaxProblem(
                    inner.blocks[0].type_start,
                    "Invalid single-argument block definition",
                    "A single-line block definition can contain only a single argument. If you meant to "
                    "define argument, use an equals sign to assign it a value. To define a nested block, "
                    "place it on a line of its own within its parent block.",
                )
            close = self.peek()
            if close.kind != "}":
                raise SyntaxProblem(
                    close.start,
                    "Invalid single-argument block definition",
                    "A single-line block definition must end with a closing brace immediately after "
                    "its single argument definition.",
                )
            self.next()
        end = self.peek()
        if end.kind not in ("\n", EOF, "}"):
            raise SyntaxProblem(
                end.start,
                "Missing newline after block definition",
                "A block definition must end with a newline.",
            )
        body.blocks.append(Block(name_tok.text, labels, label_starts, name_tok.start, tok.start, inner))

    def _where(self, offset: int) -> str:
        line = self.src.count("\n", 0, offset) + 1
        col = offset - (self.src.rfind("\n", 0, offset) + 1) + 1
        return f"{self.filename}:{line},{col}"

    # -- expressions

    def expression(self) -> Expr:
        tok = self.peek()
        if tok.kind == STRING or tok.kind == NUMBER:
            # fast path: a lone literal followed by something that cannot continue an expression
            save = self.pos
            self.next()
            if self.peek().kind in _ENDS_EXPRESSION:
                if tok.kind == STRING:
                    return Template(tok.start, [tok.text] if tok.text else [])
                return Literal(tok.start, parse_number(tok.text))
            self.pos = save
        cond = self._binary(1)
        tok = self.peek()
        if tok.kind != "?":
            return cond
        self.next()
        saved = self.nl
        self.nl = False
        t = self.expression()
        self.expect(
            ":",
            "Missing false expression in conditional",
            "The conditional operator (...?...:...) requires a false expression, delimited by a colon.",
        )
        f = self.expression()
        self.nl = saved
        return Conditional(cond.start, cond, t, f)

    def _binary(self, min_prec: int) -> Expr:
        # precedence climbing: one look at the next token per operand, not one per level
        left = self._unary()
        while True:
            tok = self.peek()
            prec = _PRECEDENCE.get(tok.kind)
            if prec is None or prec < min_prec:
                return left
            self.next()
            right = self._binary(prec + 1)
            left = Binary(left.start, tok.kind, left, right)

    def _unary(self) -> Expr:
        tok = self.peek()
        if tok.kind in ("!", "-"):
            self.next()
            operand = self._unary()
            if (
                tok.kind == "-"
                and isinstance(operand, Literal)
                and isinstance(operand.value, int | float)
                and not isinstance(operand.value, bool)
            ):
                return Literal(tok.start, -operand.value)
            return Unary(tok.start, tok.kind, operand)
        return self._postfix(self._term())

    def _postfix(self, term: Expr) -> Expr:
        steps: list[Step] = []
        splat: Splat | None = None
        while True:
            tok = self.peek()
            if tok.kind == ".":
                self.next()
                nxt = self.peek()
                if nxt.kind == IDENT:
                    self.next()
                    steps.append(GetAttr(tok.start, nxt.text))
                elif nxt.kind == NUMBER:
                    # legacy index syntax: a.0.1
                    self.next()
                    for piece in nxt.text.split("."):
                        if not piece.isdigit():
                            raise SyntaxProblem(
                                nxt.start,
                                "Invalid legacy index syntax",
                                "When using the legacy index syntax, chaining two indexes together is not "
                                "permitted. Use the proper index syntax instead, like [1][0].",
                            )
                        steps.append(Index(tok.start, Literal(nxt.start, int(piece))))
                elif nxt.kind == "*":
                    self.next()
                    base = self._wrap(term, steps)
                    steps = []
                    splat = Splat(term.start, base, [])
                    term = splat
                else:
                    raise SyntaxProblem(
                        nxt.start, "Invalid attribute name", "An attribute name is required after a dot."
                    )
                continue
            if tok.kind == "[":
                self.next()
                saved = self.nl
                self.nl = False
                if self.peek().kind == "*":
                    self.next()
                    self.expect(
                        "]",
                        "Missing close bracket on splat index",
                        "The star for a full splat operator must be immediately followed by a closing "
                        'bracket ("]").',
                    )
                    self.nl = saved
                    base = self._wrap(term, steps)
                    steps = []
                    splat = Splat(term.start, base, [])
                    term = splat
                    continue
                key = self.expression()
                self.expect(
                    "]",
                    "Missing close bracket on index",
                    'The index operator must end with a closing bracket ("]").',
                )
                self.nl = saved
                steps.append(Index(tok.start, key))
                continue
            break
        if splat is not None and term is splat:
            splat.steps = steps
            return splat
        return self._wrap(term, steps)

    def _wrap(self, term: Expr, steps: list[Step]) -> Expr:
        if not steps:
            return term
        if isinstance(term, Traversal) and not term.steps:
            src = self.src[term.start : self._last_end]
            return Traversal(term.start, term.root, steps, src)
        return Postfix(term.start, term, steps)

    @property
    def _last_end(self) -> int:
        return self.pos

    def _term(self) -> Expr:
        tok = self.peek()
        kind = tok.kind
        if kind == STRING:
            self.next()
            return Template(tok.start, [tok.text] if tok.text else [])
        if kind == NUMBER:
            self.next()
            n = parse_number(tok.text)
            return Literal(tok.start, n)
        if kind == IDENT:
            self.next()
            text = tok.text
            if text == "true":
                return Literal(tok.start, True)
            if text == "false":
                return Literal(tok.start, False)
            if text == "null":
                return Literal(tok.start, None)
            if self.peek().kind == "(" and self.peek().start == tok.end:
                return self._call(tok)
            if self.peek().kind == "(":
                return self._call(tok)
            return Traversal(tok.start, text, [], text)
        if kind == '"':
            self.next()
            return self._quoted_template(tok.start)
        if kind in ("<<", "<<-"):
            return self._heredoc()
        if kind == "(":
            self.next()
            saved = self.nl
            self.nl = False
            inner = self.expression()
            self.expect(
                ")", "Unbalanced parentheses", "Expected a closing parenthesis to terminate the expression."
            )
            self.nl = saved
            return Parenthesized(tok.start, inner)
        if kind == "[":
            return self._tuple()
        if kind == "{":
            return self._object()
        raise SyntaxProblem(
            tok.start,
            "Invalid expression",
            "Expected the start of an expression, but found an invalid expression token.",
        )

    def _call(self, name: Tok) -> Expr:
        self.next()  # (
        saved = self.nl
        self.nl = False
        args: list[Expr] = []
        expand = False
        while self.peek().kind != ")":
            args.append(self.expression())
            tok = self.peek()
            if tok.kind == "...":
                self.next()
                expand = True
                tok = self.peek()
                if tok.kind != ")":
                    raise SyntaxProblem(
                        tok.start,
                        "Missing closing parenthesis",
                        "An expanded function argument (with ...) must be immediately followed by "
                        "closing parentheses.",
                    )
                break
            if tok.kind == ",":
                self.next()
                continue
            if tok.kind != ")":
                raise SyntaxProblem(
                    tok.start,
                    "Missing argument separator",
                    "A comma is required to separate each function argument from the next.",
                )
        self.next()
        self.nl = saved
        return FunctionCall(name.start, name.text, args, expand)

    def _tuple(self) -> Expr:
        open_tok = self.next()
        saved = self.nl
        self.nl = False
        tok = self.peek()
        if tok.kind == IDENT and tok.text == "for":
            expr = self._for(open_tok.start, "]")
            self.nl = saved
            return expr
        items: list[Expr] = []
        while self.peek().kind != "]":
            items.append(self.expression())
            tok = self.peek()
            if tok.kind == ",":
                self.next()
                continue
            if tok.kind != "]":
                raise SyntaxProblem(
                    tok.start,
                    "Missing item separator",
                    "Expected a comma to mark the beginning of the next item.",
                )
        self.next()
        self.nl = saved
        return TupleCons(open_tok.start, items)

    def _object(self) -> Expr:
        open_tok = self.next()
        saved = self.nl
        self.nl = True
        while self.peek().kind == "\n":
            self.next()
        tok = self.peek()
        if tok.kind == IDENT and tok.text == "for":
            self.nl = False
            expr = self._for(open_tok.start, "}")
            self.nl = saved
            return expr
        items: list[tuple[Expr, Expr]] = []
        while True:
            while self.peek().kind == "\n":
                self.next()
            tok = self.peek()
            if tok.kind == "}":
                self.next()
                break
            if tok.kind == EOF:
                raise SyntaxProblem(
                    open_tok.start,
                    "Unterminated object constructor expression",
                    "There is no corresponding closing brace before the end of the file. This may be "
                    "caused by incorrect brace nesting elsewhere in this file.",
                )
            self.nl = False
            key = self._binary(1) if tok.kind != IDENT else self._object_key()
            sep = self.peek()
            if sep.kind not in ("=", ":"):
                raise SyntaxProblem(
                    sep.start,
                    "Missing key/value separator",
                    'Expected an equals sign ("=") to mark the beginning of the attribute value.',
                )
            self.next()
            value = self.expression()
            self.nl = True
            items.append((key, value))
            tok = self.peek()
            if tok.kind in (",", "\n"):
                self.next()
                continue
            if tok.kind != "}":
                raise SyntaxProblem(
                    tok.start,
                    "Missing attribute separator",
                    "Expected a newline or comma to mark the beginning of the next attribute.",
                )
        self.nl = saved
        return ObjectCons(open_tok.start, items)

    def _object_key(self) -> Expr:
        # a bare identifier is taken literally; anything longer is an expression
        tok = self.peek()
        save_pos = self.pos
        self.next()
        if self.peek().kind in ("=", ":"):
            return Literal(tok.start, tok.text)
        self.pos = save_pos
        return self._binary(1)

    def _for(self, start: int, close: str) -> Expr:
        self.next()  # for
        first = self.expect(
            IDENT, "Invalid 'for' expression", "For expression requires variable name after 'for'."
        )
        key_var: str | None = None
        val_var = first.text
        if self.peek().kind == ",":
            self.next()
            second = self.expect(
                IDENT, "Invalid 'for' expression", "For expression requires value variable name after comma."
            )
            key_var, val_var = first.text, second.text
        in_tok = self.peek()
        if in_tok.kind != IDENT or in_tok.text != "in":
            raise SyntaxProblem(
                in_tok.start,
                "Invalid 'for' expression",
                "For expression requires the 'in' keyword after its name declarations.",
            )
        self.next()
        coll = self.expression()
        self.expect(
            ":",
            "Invalid 'for' expression",
            "For expression requires a colon after the collection expression.",
        )
        key_expr: Expr | None = None
        val_expr = self.expression()
        grouping = False
        if close == "}":
            self.expect(
                "=>", "Invalid 'for' expression", "Key expression is required when building an object."
            )
            key_expr = val_expr
            val_expr = self.expression()
            if self.peek().kind == "...":
                self.next()
                grouping = True
        cond: Expr | None = None
        tok = self.peek()
        if tok.kind == IDENT and tok.text == "if":
            self.next()
            cond = self.expression()
        self.expect(
            close,
            "Invalid 'for' expression",
            f"Extra characters after the end of the 'for' expression; expected {close!r}.",
        )
        return ForExpr(start, key_var, val_var, coll, key_expr, val_expr, cond, grouping)

    # -- templates

    def _quoted_template(self, open_quote: int) -> Template:
        parts = self._template_parts(quoted=True, start=open_quote)
        return Template(open_quote, parts)

    def _heredoc(self) -> Expr:
        start = self.peek().start
        m = _HEREDOC_START.match(self.src, start)
        if m is None:
            raise SyntaxProblem(
                start, "Invalid heredoc", "A heredoc needs a marker name and a newline, like <<EOT."
            )
        flush = m.group(1) == "-"
        marker = m.group(2)
        content_start = m.end()
        # find the closing marker: a line holding only the marker (leading spaces allowed)
        close = re.compile(r"^[ \t]*" + re.escape(marker) + r"[ \t]*\r?$", re.M)
        cm = close.search(self.src, content_start)
        if cm is None:
            raise SyntaxProblem(
                start, "Unterminated template string", "No closing marker was found for the string."
            )
        self.pos = content_start
        parts = self._template_parts(quoted=False, start=start, limit=cm.start())
        if flush:
            _flush_heredoc(parts)
        self.pos = cm.end()
        self._cache = None
        return Template(start, parts)

    def _template_parts(self, *, quoted: bool, start: int, limit: int = -1) -> list[Part]:
        """Parse template content from ``self.pos`` up to the closing quote (or ``limit``).

        Literals are kept line by line in heredocs, so a flush heredoc can trim each line.
        """
        src = self.src
        end = len(src) if limit < 0 else limit
        stack: list[_Open] = []
        parts: list[Part] = []
        buf: list[str] = []
        at_line_start = not quoted
        buf_line_start = at_line_start
        strip_next = False
        lit_re = _QUOTED_LIT if quoted else _HEREDOC_LIT
        pos = self.pos

        def flush_buf() -> None:
            nonlocal buf_line_start
            if buf:
                text = "".join(buf)
                buf.clear()
                parts.append(text)
            buf_line_start = False

        while True:
            if pos >= end:
                if quoted:
                    raise SyntaxProblem(
                        start, "Unterminated template string", "No closing marker was found for the string."
                    )
                break
            ch = src[pos]
            m = lit_re.match(src, pos, end)
            if m is not None:
                text = m.group()
                if strip_next:
                    text = text.lstrip()
                    strip_next = not text
                if not buf:
                    buf_line_start = at_line_start
                buf.append(text)
                at_line_start = False
                pos = m.end()
                continue
            if ch == '"' and quoted:
                pos += 1
                break
            if ch == "\n":
                if quoted:
                    raise SyntaxProblem(
                        pos,
                        "Invalid multi-line string",
                        "Quoted strings may not be split over multiple lines. To produce a multi-line "
                        "string, either use the \\n escape to represent a newline character or use the "
                        '"heredoc" multi-line template syntax.',
                    )
                if strip_next:
                    pos += 1
                    continue
                if not buf:
                    buf_line_start = at_line_start
                buf.append("\n")
                pos += 1
                flush_buf()
                at_line_start = True
                continue
            if ch == "\\" and quoted:
                if pos + 1 >= end:
                    raise SyntaxProblem(
                        start, "Unterminated template string", "No closing marker was found for the string."
                    )
                esc = src[pos + 1]
                if esc in _ESCAPES:
                    out = _ESCAPES[esc]
                    pos += 2
                elif esc in "uU":
                    width = 4 if esc == "u" else 8
                    digits = src[pos + 2 : pos + 2 + width]
                    if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                        raise SyntaxProblem(
                            pos,
                            "Invalid escape sequence",
                            f"The \\{esc} escape sequence requires {width} hexadecimal digits.",
                        )
                    out = chr(int(digits, 16))
                    pos += 2 + width
                else:
                    raise SyntaxProblem(
                        pos,
                        "Invalid escape sequence",
                        f'The symbol "{esc}" is not a valid escape sequence selector.',
                    )
                if not buf:
                    buf_line_start = at_line_start
                buf.append(out)
                at_line_start = False
                strip_next = False
                continue
            if ch in "$%":
                nxt2 = src[pos + 1 : pos + 3]
                if nxt2[:1] == ch and nxt2[1:2] == "{":
                    # $${ and %%{ are the escapes for a literal ${ and %{
                    if not buf:
                        buf_line_start = at_line_start
                    buf.append(ch + "{")
                    at_line_start = False
                    strip_next = False
                    pos += 3
                    continue
                if nxt2[:1] != "{":
                    if not buf:
                        buf_line_start = at_line_start
                    buf.append(ch)
                    at_line_start = False
                    strip_next = False
                    pos += 1
                    continue
                seq_start = pos
                pos += 2
                strip_left = src.startswith("~", pos)
                flush_buf()
                if strip_left:
                    pos += 1
                    while parts and isinstance(parts[-1], str):
                        last = parts[-1].rstrip()
                        if last:
                            parts[-1] = last
                            break
                        parts.pop()
                at_line_start = False
                if ch == "$":
                    expr, pos, strip_right = self._interpolation(pos, end)
                    part: Part = Interpolation(expr, src[seq_start:pos])
                    parts.append(part)
                    strip_next = strip_right
                    continue
                # a %{ directive }
                keyword, pos, strip_right, cond, for_spec = self._directive(pos, end)
                strip_next = strip_right
                if keyword in ("if", "for"):
                    stack.append(_Open(keyword, seq_start, parts, cond, for_spec))
                    parts = []
                    continue
                top = stack[-1] if stack else None
                if keyword == "else":
                    if top is None or top.kind != "if" or top.then_parts is not None:
                        raise SyntaxProblem(
                            seq_start,
                            "Unexpected else directive",
                            "An else clause is allowed only in an if directive.",
                        )
                    top.then_parts = parts
                    parts = []
                elif keyword == "endif":
                    if top is None or top.kind != "if" or top.cond is None:
                        raise SyntaxProblem(
                            seq_start,
                            "Unexpected endif directive",
                            "An endif marker is allowed only after an if directive.",
                        )
                    stack.pop()
                    if top.then_parts is None:
                        directive: Part = IfDirective(top.start, top.cond, parts, [])
                    else:
                        directive = IfDirective(top.start, top.cond, top.then_parts, parts)
                    parts = top.outer
                    parts.append(directive)
                else:  # endfor
                    if top is None or top.kind != "for" or top.for_spec is None:
                        raise SyntaxProblem(
                            seq_start,
                            "Unexpected endfor directive",
                            "An endfor marker is allowed only after a for directive.",
                        )
                    stack.pop()
                    key_var, val_var, coll = top.for_spec
                    body_parts = parts
                    parts = top.outer
                    parts.append(ForDirective(top.start, key_var, val_var, coll, body_parts))
                continue
            raise SyntaxProblem(pos, "Invalid character", "This character is not expected in a template.")
        flush_buf()
        if stack:
            kind = stack[-1].kind
            raise SyntaxProblem(
                start,
                f"Unterminated template {kind if kind != 'else' else 'if'} directive",
                "A template directive is missing its end marker.",
            )
        self.pos = pos
        self._cache = None
        return parts

    def _interpolation(self, pos: int, end: int) -> tuple[Expr, int, bool]:
        """Parse ``expr ~}`` after ``${``: the expression, the offset after ``}``, the strip flag."""
        saved_nl = self.nl
        self.pos = pos
        self.nl = False
        expr = self.expression()
        tok = self.peek()
        strip = False
        if tok.kind == "~":
            self.next()
            strip = True
            tok = self.peek()
        if tok.kind != "}" or tok.start >= end:
            raise SyntaxProblem(
                tok.start,
                "Extra characters after interpolation expression",
                "Expected a closing brace to end the interpolation expression, but found extra characters.",
            )
        self.next()
        self.nl = saved_nl
        return expr, self.pos, strip

    def _directive(
        self, pos: int, end: int
    ) -> tuple[str, int, bool, Expr | None, tuple[str | None, str, Expr] | None]:
        """Parse a ``%{ ... }`` directive after ``%{``: if, else, endif, for, endfor."""
        saved_nl = self.nl
        self.pos = pos
        self.nl = False
        kw = self.peek()
        cond: Expr | None = None
        for_spec: tuple[str | None, str, Expr] | None = None
        if kw.kind != IDENT or kw.text not in ("if", "else", "endif", "for", "endfor"):
            raise SyntaxProblem(
                kw.start,
                "Invalid template directive",
                'A template directive keyword ("if", "for", etc) is expected at the beginning '
                "of a %{ sequence.",
            )
        self.next()
        if kw.text == "if":
            cond = self.expression()
        elif kw.text == "for":
            first = self.expect(
                IDENT, "Invalid 'for' directive", "For directive requires variable name after 'for'."
            )
            key_var: str | None = None
            val_var = first.text
            if self.peek().kind == ",":
                self.next()
                second = self.expect(
                    IDENT,
                    "Invalid 'for' directive",
                    "For directive requires value variable name after comma.",
                )
                key_var, val_var = first.text, second.text
            in_tok = self.peek()
            if in_tok.kind != IDENT or in_tok.text != "in":
                raise SyntaxProblem(
                    in_tok.start,
                    "Invalid 'for' directive",
                    "For directive requires 'in' keyword after names.",
                )
            self.next()
            for_spec = (key_var, val_var, self.expression())
        tok = self.peek()
        strip = False
        if tok.kind == "~":
            self.next()
            strip = True
            tok = self.peek()
        if tok.kind != "}" or tok.start >= end:
            raise SyntaxProblem(
                tok.start,
                f"Extra characters in {kw.text} marker",
                "Expected a closing brace to end the sequence, but found extra characters.",
            )
        self.next()
        self.nl = saved_nl
        return kw.text, self.pos, strip, cond, for_spec


class _Open:
    """A template directive whose end marker is still to come."""

    __slots__ = ("cond", "for_spec", "kind", "outer", "start", "then_parts")

    def __init__(
        self,
        kind: str,
        start: int,
        outer: list[Part],
        cond: Expr | None,
        for_spec: tuple[str | None, str, Expr] | None,
    ) -> None:
        self.kind = kind
        self.start = start
        self.outer = outer
        self.cond = cond
        self.for_spec = for_spec
        self.then_parts: list[Part] | None = None


def _flush_heredoc(parts: list[Part]) -> None:
    """Trim the common leading whitespace of a ``<<-`` heredoc, as hclsyntax's flushHeredocTemplateParts does.

    Blank lines do not count; a line that starts with an interpolation has no indent.
    """
    big = 1 << 62
    min_spaces = big
    newline = True
    adjust: list[int] = []
    for i, p in enumerate(parts):
        if newline:
            newline = False
            if isinstance(p, str):
                trimmed = p.lstrip()
                if not trimmed and p.endswith("\n"):
                    spaces = big
                else:
                    spaces = len(p) - len(trimmed)
                    adjust.append(i)
            else:
                spaces = 0
            min_spaces = min(min_spaces, spaces)
        if isinstance(p, str) and p.endswith("\n"):
            newline = True
    if min_spaces == big:
        return
    for i in adjust:
        text = parts[i]
        assert isinstance(text, str)
        parts[i] = text[min_spaces:]


def parse(src: str, filename: str = "") -> Body:
    """Parse a whole HCL file; raises :class:`SyntaxProblem` at the first syntax error."""
    return Parser(src, filename).parse_file()
