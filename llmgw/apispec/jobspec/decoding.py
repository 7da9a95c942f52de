"""Decoding a parsed jobspec into Nomad's api.Job JSON, the way jobspec2 does.

Owns the mirror of gohcl's struct decoding driven by the ``hcl`` tags of
:mod:`llmgw.apispec` (``name,optional`` attribute, ``name,block`` block, repeatable
when the Go type is a slice or a labelled map, ``name,label`` label, a bare name a
required attribute) and jobspec2's special cases: the job label as ID and Name,
durations from Go duration strings, ``meta``/``env`` as blocks or attributes,
free-form ``config`` blocks (jobspec2's BlocksAsAttrs), constraint and affinity
shorthands, top-level ``task`` and ``vault`` blocks, group ``vault``, task
``scaling "cpu"|"mem"``, and normalizeJob (ports, templates, vault, identities,
periodic).

The output is sparse: a field appears when the jobspec set it or jobspec2 fills it.
Must not: parse text (that is :mod:`.syntax`) or canonicalize (:mod:`.canonical`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

from llmgw.apispec import FieldSpec, GoType, HclKind, Kind, go_type, struct
from llmgw.apispec.jobspec.diagnostics import Diagnostic, SourceMap, SyntaxProblem
from llmgw.apispec.jobspec.expressions import (
    Context,
    ConversionError,
    Expr,
    ObjectCons,
    Value,
    normalize_number,
    to_bool,
    to_number,
    to_string,
    type_name,
)
from llmgw.apispec.jobspec.goduration import DurationError, parse_go_duration
from llmgw.apispec.jobspec.syntax import Attribute, Block, Body

Doc = dict[str, object]

_CONSTRAINT_SHORTHANDS = (
    "version",
    "semver",
    "regexp",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
)


@dataclass(frozen=True, slots=True)
class Schema:
    """A struct's HCL face: attributes and blocks by HCL name, label fields in order."""

    name: str
    attrs: Mapping[str, FieldSpec]
    required: tuple[str, ...]
    blocks: Mapping[str, FieldSpec]
    labels: tuple[FieldSpec, ...]


@cache
def schema(struct_name: str) -> Schema:
    spec = struct(struct_name)
    attrs: dict[str, FieldSpec] = {}
    blocks: dict[str, FieldSpec] = {}
    labels: list[FieldSpec] = []
    required: list[str] = []
    for f in spec.fields.values():
        if f.hcl is None:
            continue
        kind = f.hcl.kind
        if kind is HclKind.BLOCK:
            blocks[f.hcl.name] = f
        elif kind is HclKind.LABEL:
            labels.append(f)
        else:
            attrs[f.hcl.name] = f
            if kind is HclKind.REQUIRED:
                required.append(f.hcl.name)
    return Schema(struct_name, attrs, tuple(required), blocks, tuple(labels))


@cache
def _label_names(go_type_text: str) -> tuple[str, ...]:
    """The label names of the struct a block field holds (one per ``,label`` field)."""
    t = go_type(go_type_text).deref()
    if t.kind in (Kind.SLICE, Kind.MAP) and t.elem is not None:
        t = t.elem.deref()
    if t.kind is Kind.STRUCT:
        return tuple(f.hcl.name if f.hcl else "" for f in schema(t.name).labels)
    return ()


def _levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _suggest(given: str, names: list[str]) -> str:
    # hclsyntax's nameSuggestion: the first name within edit distance 2
    for name in names:
        if _levenshtein(given, name) < 3:
            return name
    return ""


class Decoder:
    """One decode of one parsed file; collects diagnostics instead of stopping at the first."""

    def __init__(self, smap: SourceMap, ctx: Context) -> None:
        self.smap = smap
        self.ctx = ctx
        self.diags: list[Diagnostic] = []

    # -- diagnostics

    def error(self, offset: int, summary: str, detail: str = "") -> None:
        self.diags.append(self.smap.diag(offset, summary, detail))

    def problem(self, p: SyntaxProblem) -> None:
        self.error(p.offset, p.summary, p.detail)

    def evaluate(self, expr: Expr) -> tuple[bool, Value]:
        try:
            return True, expr.eval(self.ctx)
        except SyntaxProblem as p:
            self.problem(p)
            return False, None

    # -- body content, as hclsyntax Body.Content checks it

    def content(
        self,
        body: Body,
        sch: Schema,
        *,
        hidden_attrs: frozenset[str] = frozenset(),
        hidden_blocks: frozenset[str] = frozenset(),
        extra_blocks: Mapping[str, tuple[str, ...]] | None = None,
    ) -> tuple[dict[str, Attribute], dict[str, list[Block]]]:
        """Attributes and blocks that ``sch`` wants; everything else is an error at its position.

        ``extra_blocks`` names block types a special decoder takes (with their label count).
        """
        attrs: dict[str, Attribute] = {}
        for name, attr in body.attributes.items():
            if name in hidden_attrs:
                continue
            if name in sch.attrs:
                attrs[name] = attr
                continue
            candidates = [n for n in sch.attrs if n not in body.attributes]
            suggestion = _suggest(name, candidates)
            if suggestion:
                hint = f' Did you mean "{suggestion}"?'
            elif name in sch.blocks or (extra_blocks and name in extra_blocks):
                hint = f' Did you mean to define a block of type "{name}"?'
            else:
                hint = ""
            self.error(
                attr.name_start,
                "Unsupported argument",
                f'An argument named "{name}" is not expected here.{hint}',
            )
        for name in sch.required:
            if name not in attrs and name not in hidden_attrs:
                self.error(
                    body.open_brace,
                    "Missing required argument",
                    f'The argument "{name}" is required, but no definition was found.',
                )
        blocks: dict[str, list[Block]] = {}
        for block in body.blocks:
            btype = block.type
            if btype in hidden_blocks:
                continue
            if btype in sch.blocks:
                want = self._label_names(sch.blocks[btype])
            elif extra_blocks and btype in extra_blocks:
                want = extra_blocks[btype]
            else:
                names = list(sch.blocks) + list(extra_blocks or {})
                suggestion = _suggest(btype, names)
                if suggestion:
                    hint = f' Did you mean "{suggestion}"?'
                elif btype in sch.attrs:
                    hint = (
                        f' Did you mean to define argument "{btype}"?'
                        " If so, use the equals sign to assign it a value."
                    )
                else:
                    hint = ""
                self.error(
                    block.type_start,
                    "Unsupported block type",
                    f'Blocks of type "{btype}" are not expected here.{hint}',
                )
                continue
            if not self._labels_ok(block, want):
                continue
            blocks.setdefault(btype, []).append(block)
        return attrs, blocks

    def _label_names(self, f: FieldSpec) -> tuple[str, ...]:
        return _label_names(f.go_type)

    def _labels_ok(self, block: Block, names: tuple[str, ...]) -> bool:
        got = len(block.labels)
        want = len(names)
        if got > want:
            if want == 0:
                self.error(
                    block.label_starts[0],
                    f"Extraneous label for {block.type}",
                    f"No labels are expected for {block.type} blocks.",
                )
            else:
                self.error(
                    block.label_starts[want],
                    f"Extraneous label for {block.type}",
                    f"Only {want} labels ({', '.join(names)}) are expected for {block.type} blocks.",
                )
            return False
        if got < want:
            self.error(
                block.open_brace,
                f"Missing {names[got]} for {block.type}",
                f"All {block.type} blocks must have {want} labels ({', '.join(names)}).",
            )
            return False
        return True

    # -- structs

    def struct_body(
        self,
        body: Body,
        struct_name: str,
        out: Doc,
        *,
        hidden_attrs: frozenset[str] = frozenset(),
        hidden_blocks: frozenset[str] = frozenset(),
    ) -> Doc:
        """gohcl's decodeBodyToStruct into ``out`` (JSON keys are the Go field names)."""
        sch = schema(struct_name)
        attrs, blocks = self.content(body, sch, hidden_attrs=hidden_attrs, hidden_blocks=hidden_blocks)
        for name, attr in attrs.items():
            f = sch.attrs[name]
            ok, value = self.attribute_value(attr.expr, go_type(f.go_type))
            if ok and value is not None:
                out[f.name] = value
        for btype, found in blocks.items():
            f = sch.blocks[btype]
            self.block_field(f, found, out)
        return out

    def block_field(self, f: FieldSpec, found: list[Block], out: Doc) -> None:
        t = go_type(f.go_type)
        base = t.deref()
        if base.kind is Kind.SLICE:
            assert base.elem is not None
            elem = base.elem.deref()
            out[f.name] = [self.block(b, elem.name) for b in found]
            return
        if base.kind is Kind.MAP and base.elem is not None and base.elem.deref().kind is Kind.STRUCT:
            # a labelled map of blocks (group volume "name" {...}): keyed by the label
            elem = base.elem.deref()
            entries: Doc = {}
            for b in found:
                entries[b.labels[0] if b.labels else ""] = self.block(b, elem.name)
            out[f.name] = entries
            return
        if len(found) > 1:
            first = found[0]
            line, col = self.smap.position(first.type_start)
            self.error(
                found[1].type_start,
                f"Duplicate {found[1].type} block",
                f"Only one {found[1].type} block is allowed. "
                f"Another was defined at {self.smap.filename}:{line},{col}.",
            )
            return
        block = found[0]
        if base.kind is Kind.MAP:
            assert base.elem is not None
            out[f.name] = self.map_block(block.body, base.elem)
            return
        out[f.name] = self.block(block, base.name)

    def block(self, block: Block, struct_name: str) -> Doc:
        handler = _BLOCK_DECODERS.get(struct_name)
        out: Doc = {}
        sch = schema(struct_name)
        for label_field, label in zip(sch.labels, block.labels, strict=False):
            out[label_field.name] = label
        if handler is not None:
            handler(self, block, out)
            return out
        return self.struct_body(block.body, struct_name, out)

    # -- attribute values by Go type (gohcl DecodeExpression + cty convert + gocty)

    def attribute_value(self, expr: Expr, t: GoType) -> tuple[bool, Value]:
        base = t.deref()
        ok, value = self.evaluate(expr)
        if not ok:
            return False, None
        if base.kind is Kind.DURATION:
            return self.duration(expr, value)
        if value is None:
            return True, None
        if base.kind is Kind.ANY or (
            base.kind is Kind.MAP and base.elem is not None and base.elem.kind is Kind.ANY
        ):
            return True, _interface(value)
        try:
            return True, convert(value, base)
        except ConversionError as e:
            self.error(expr.start, "Unsuitable value type", f"Unsuitable value: {e}")
            return False, None

    def duration(self, expr: Expr, value: Value) -> tuple[bool, Value]:
        """jobspec2's decodeDuration: a Go duration string or a number of nanoseconds."""
        if isinstance(value, str):
            try:
                return True, parse_go_duration(value)
            except DurationError as e:
                self.error(expr.start, "Unsuitable value type", f"Unsuitable duration value: {e}")
                return False, None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(
                expr.start,
                "Unsuitable value type",
                f"Unsuitable value: expected a string but found {type_name(value)}",
            )
            return False, None
        try:
            return True, _whole(value, 64, True)
        except ConversionError as e:
            self.error(expr.start, "Unsuitable value type", f"Unsuitable value: {e}")
            return False, None

    def map_block(self, body: Body, elem: GoType) -> Doc:
        """A map-typed block (``meta {}``, ``env {}``, ``config {}``): its attributes are the entries.

        jobspec2 wraps every job body in BlocksAsAttrs, so nested blocks count as
        attributes too (a list of objects), which only a free-form map can hold.
        """
        free_form = elem.kind is Kind.ANY
        entries = _blocks_as_attrs(body)
        out: Doc = {}
        for name, (expr, start) in entries.items():
            if isinstance(expr, _BlockValues):
                value: Value = expr.eval(self)
                if value is _FAILED:
                    continue
            else:
                ok, value = self.evaluate(expr)
                if not ok:
                    continue
                if free_form and isinstance(expr, ObjectCons):
                    value = [value]  # attrExpr: an object constructor becomes a one-element list
            if free_form:
                out[name] = _interface(value)
                continue
            if value is None:
                continue
            try:
                out[name] = convert(value, elem)
            except ConversionError as e:
                self.error(start, "Unsuitable value type", f"Unsuitable value: {e}")
        return out

    def map_attribute(self, attr: Attribute) -> Doc | None:
        """decodeAsAttribute: ``meta = { ... }`` read as map[string]string."""
        ok, value = self.evaluate(attr.expr)
        if not ok:
            return None
        try:
            converted = convert(value, go_type("map[string]string"))
        except ConversionError as e:
            self.error(attr.expr.start, "Unsuitable value type", f"Unsuitable value: {e}")
            return None
        return converted if isinstance(converted, dict) else {}

    def meta_like(self, body: Body, name: str, out: Doc, field_name: str) -> bool:
        """jobspec2's decodeAsAttribute for ``name``: True when the attribute form was used."""
        attr = body.attributes.get(name)
        if attr is None:
            return False
        for b in body.blocks:
            if b.type == name:
                line, col = self.smap.position(attr.name_start)
                self.error(
                    b.type_start,
                    f"Duplicate {name} block",
                    f"{name} may not be defined more than once. Another definition is defined at "
                    f"{self.smap.filename}:{line},{col}.",
                )
                return True
        value = self.map_attribute(attr)
        if value is not None:
            out[field_name] = value
        return True


class _BlockValues:
    """Nested blocks inside a free-form body, as BlocksAsAttrs turns them into a list of objects."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks

    def eval(self, dec: Decoder) -> Value:
        items: list[Value] = []
        for b in self.blocks:
            obj: Value = dec.map_block(b.body, go_type("any"))
            for label in reversed(b.labels):
                obj = {label: [obj]}
            items.append(obj)
        return items


_FAILED = object()


def _blocks_as_attrs(body: Body) -> dict[str, tuple[Expr | _BlockValues, int]]:
    entries: dict[str, tuple[Expr | _BlockValues, int]] = {}
    for name, attr in body.attributes.items():
        entries[name] = (attr.expr, attr.expr.start)
    grouped: dict[str, list[Block]] = {}
    for b in body.blocks:
        grouped.setdefault(b.type, []).append(b)
    for name, blocks in grouped.items():
        entries[name] = (_BlockValues(blocks), blocks[0].type_start)
    return entries


# ------------------------------------------------------------------ conversions


def _whole(n: int | float, bits: int, signed: bool) -> int:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if isinstance(n, float) and not n.is_integer():
        raise ConversionError(f"value must be a whole number, between {lo} and {hi}")
    i = int(n)
    if not lo <= i <= hi:
        raise ConversionError(f"value must be a whole number, between {lo} and {hi}")
    return i


def _type_phrase(t: GoType) -> str:
    k = t.kind
    if k is Kind.POINTER and t.elem is not None:
        return _type_phrase(t.elem)
    if k is Kind.STRING:
        return "string"
    if k in (Kind.INT, Kind.FLOAT, Kind.DURATION):
        return "number"
    if k is Kind.BOOL:
        return "bool"
    if k is Kind.SLICE and t.elem is not None:
        return f"list of {_type_phrase(t.elem)}"
    if k is Kind.MAP and t.elem is not None:
        return f"map of {_type_phrase(t.elem)}"
    if k is Kind.STRUCT:
        return "object"
    return "any"


def convert(value: Value, t: GoType) -> Value:
    """cty's convert into the type gocty implies for ``t``, then into the Go value's JSON."""
    t = t.deref()
    k = t.kind
    if value is None:
        return None
    if k is Kind.STRING:
        return to_string(value)
    if k is Kind.INT:
        return _whole(to_number(value), t.bits, t.signed)
    if k is Kind.FLOAT:
        return normalize_number(to_number(value))
    if k is Kind.BOOL:
        return to_bool(value)
    if k is Kind.DURATION:
        if isinstance(value, str):
            try:
                return parse_go_duration(value)
            except DurationError as e:
                raise ConversionError(str(e)) from None
        return _whole(to_number(value), 64, True)
    if k is Kind.SLICE and t.elem is not None:
        if not isinstance(value, list):
            raise ConversionError(f"{_type_phrase(t)} required")
        out: list[Value] = []
        for i, v in enumerate(value):
            try:
                out.append(convert(v, t.elem))
            except ConversionError as e:
                raise ConversionError(f"element {i}: {e}") from None
        return out
    if k is Kind.MAP and t.elem is not None:
        if not isinstance(value, dict):
            raise ConversionError(f"{_type_phrase(t)} required")
        if t.elem.kind is Kind.ANY:
            return _interface(value)
        m: Doc = {}
        for key in sorted(value):
            try:
                m[key] = convert(value[key], t.elem)
            except ConversionError as e:
                raise ConversionError(f'element "{key}": {e}') from None
        return m
    if k is Kind.ANY:
        return _interface(value)
    raise ConversionError(f"{_type_phrase(t)} required")


def _interface(value: Value) -> Value:
    """interfaceFromCtyValue: numbers become int when whole, collections stay as they are."""
    if isinstance(value, float):
        return normalize_number(value)
    if isinstance(value, list):
        return [_interface(v) for v in value]
    if isinstance(value, dict):
        return {k: _interface(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------ jobspec2's special blocks


def _constraint_like(dec: Decoder, block: Block, out: Doc, *, affinity: bool) -> None:
    """decodeConstraint / decodeAffinity: hcldec specs with shorthand attributes."""
    names: dict[str, str] = {"attribute": "string", "value": "string", "operator": "string"}
    if affinity:
        names["weight"] = "number"
        shorthands: tuple[str, ...] = (
            "version",
            "semver",
            "regexp",
            "set_contains_any",
            "set_contains_all",
            "set_contains",
        )
    else:
        names.update(
            {
                "distinct_property": "string",
                "distinct_hosts": "bool",
                "is_set": "string",
                "is_not_set": "string",
            }
        )
        shorthands = ("version", "semver", "regexp", "set_contains")
    for s in _CONSTRAINT_SHORTHANDS:
        names.setdefault(s, "string")
    body = block.body
    for b in body.blocks:
        dec.error(b.type_start, "Unsupported block type", f'Blocks of type "{b.type}" are not expected here.')
    values: dict[str, Value] = {}
    failed = False
    for name, attr in body.attributes.items():
        if name not in names:
            suggestion = _suggest(name, [n for n in names if n not in body.attributes])
            hint = f' Did you mean "{suggestion}"?' if suggestion else ""
            dec.error(
                attr.name_start,
                "Unsupported argument",
                f'An argument named "{name}" is not expected here.{hint}',
            )
            failed = True
            continue
        ok, value = dec.evaluate(attr.expr)
        if not ok:
            failed = True
            continue
        try:
            kind = names[name]
            if value is None:
                values[name] = None
            elif kind == "string":
                values[name] = to_string(value)
            elif kind == "bool":
                values[name] = to_bool(value)
            else:
                values[name] = to_number(value)
        except ConversionError as e:
            dec.error(
                attr.expr.start,
                "Incorrect attribute value type",
                f'Inappropriate value for attribute "{name}": {e}.',
            )
            failed = True
    if failed:
        return

    def text(n: str) -> str:
        v = values.get(n)
        return v if isinstance(v, str) else ""

    ltarget, rtarget, operand = text("attribute"), text("value"), text("operator")
    for s in shorthands:
        if text(s):
            operand, rtarget = s, text(s)
    if not affinity:
        if values.get("distinct_hosts") is True:
            operand = "distinct_hosts"
        if text("distinct_property"):
            operand, ltarget = "distinct_property", text("distinct_property")
    if not operand:
        operand = "="
    out["LTarget"] = ltarget
    out["RTarget"] = rtarget
    out["Operand"] = operand
    if affinity and values.get("weight") is not None:
        w = values["weight"]
        assert isinstance(w, int | float)
        # Go: int8(w) wraps around; the weight's range is checked later by the server
        out["Weight"] = ((int(w) + 128) % 256) - 128


def _decode_constraint(dec: Decoder, block: Block, out: Doc) -> None:
    _constraint_like(dec, block, out, affinity=False)


def _decode_affinity(dec: Decoder, block: Block, out: Doc) -> None:
    _constraint_like(dec, block, out, affinity=True)


def _decode_group(dec: Decoder, block: Block, out: Doc) -> None:
    body = block.body
    hidden_attrs: set[str] = set()
    if dec.meta_like(body, "meta", out, "Meta"):
        hidden_attrs.add("meta")
    vault: Doc | None = None
    for b in body.blocks:
        if b.type == "vault" and dec._labels_ok(b, ()):
            vault = dec.struct_body(b.body, "Vault", {})
    dec.struct_body(
        body, "TaskGroup", out, hidden_attrs=frozenset(hidden_attrs), hidden_blocks=frozenset({"vault"})
    )
    if vault is not None:
        for task in _list_of_docs(out.get("Tasks")):
            task.setdefault("Vault", vault)
    scaling = out.get("Scaling")
    if isinstance(scaling, dict):
        if not scaling.get("Type"):
            scaling["Type"] = "horizontal"
        if scaling.get("Max") is None or scaling.get("Type") != "horizontal":
            sb = next(b for b in body.blocks if b.type == "scaling")
            if "max" not in sb.body.attributes:
                dec.error(
                    sb.body.open_brace,
                    "Missing required argument",
                    'The argument "max" is required, but no definition was found.',
                )
            type_attr = sb.body.attributes.get("type")
            if scaling.get("Type") != "horizontal" and type_attr is not None:
                dec.error(
                    type_attr.expr.start,
                    "Invalid group scaling type",
                    f'task group scaling policy had invalid type: "{scaling.get("Type")}"',
                )


def _decode_task(dec: Decoder, block: Block, out: Doc) -> None:
    body = block.body
    hidden_attrs: set[str] = set()
    if dec.meta_like(body, "env", out, "Env"):
        hidden_attrs.add("env")
    if dec.meta_like(body, "meta", out, "Meta"):
        hidden_attrs.add("meta")
    policies: list[Doc] = []
    seen: dict[str, Block] = {}
    for b in body.blocks:
        if b.type != "scaling":
            continue
        if not dec._labels_ok(b, ("name",)):
            continue
        label = b.labels[0].lower()
        policy_type = {"cpu": "vertical_cpu", "mem": "vertical_mem"}.get(label)
        if policy_type is None:
            dec.error(
                b.label_starts[0], "Invalid scaling policy name", 'scaling policy name must be "cpu" or "mem"'
            )
            continue
        if label in seen:
            line, col = dec.smap.position(seen[label].type_start)
            dec.error(
                b.type_start,
                f'Duplicate scaling "{label}" block',
                f"Only one scaling {label} block is allowed. "
                f"Another was defined at {dec.smap.filename}:{line},{col}.",
            )
            continue
        seen[label] = b
        policy = dec.struct_body(b.body, "ScalingPolicy", {})
        if not policy.get("Type"):
            policy["Type"] = policy_type
        elif policy["Type"] != policy_type:
            dec.error(
                b.type_start,
                "Invalid scaling policy type",
                f'Invalid policy type, expected "{policy["Type"]}" but found "{policy_type}"',
            )
            continue
        policies.append(policy)
    dec.struct_body(
        body, "Task", out, hidden_attrs=frozenset(hidden_attrs), hidden_blocks=frozenset({"scaling"})
    )
    if policies:
        out["ScalingPolicies"] = policies


_BLOCK_DECODERS: dict[str, Callable[[Decoder, Block, Doc], None]] = {
    "Constraint": _decode_constraint,
    "Affinity": _decode_affinity,
    "TaskGroup": _decode_group,
    "Task": _decode_task,
}


def _list_of_docs(v: object) -> list[Doc]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


# ------------------------------------------------------------------ the job


def decode_job(dec: Decoder, job_block: Block) -> Doc:
    """decodeJob + normalizeJob for the one ``job "id" {}`` block."""
    job_id = job_block.labels[0]
    body = job_block.body
    job: Doc = {}
    hidden_attrs: set[str] = set()
    if dec.meta_like(body, "meta", job, "Meta"):
        hidden_attrs.add("meta")

    # decodeTopLevelExtras: a job-level vault block and job-level tasks
    vault: Doc | None = None
    vault_block: Block | None = None
    alone: list[Doc] = []
    for b in body.blocks:
        if b.type == "vault":
            if not dec._labels_ok(b, ()):
                continue
            if vault_block is not None:
                line, col = dec.smap.position(vault_block.type_start)
                dec.error(
                    b.type_start,
                    "Duplicate vault block",
                    'Only one block of type "vault" is allowed. '
                    f"Previous definition was at {dec.smap.filename}:{line},{col}.",
                )
                continue
            vault_block = b
            vault = dec.struct_body(b.body, "Vault", {})
        elif b.type == "task":
            if not dec._labels_ok(b, ("name",)):
                continue
            task = dec.block(b, "Task")
            alone.append({"Name": b.labels[0], "Tasks": [task]})

    dec.struct_body(
        body, "Job", job, hidden_attrs=frozenset(hidden_attrs), hidden_blocks=frozenset({"vault", "task"})
    )
    _normalize(job, job_id, vault, alone)
    return job


def _normalize(job: Doc, job_id: str, vault: Doc | None, alone: list[Doc]) -> None:
    job.setdefault("Name", job_id)
    job.setdefault("ID", job_id)
    periodic = job.get("Periodic")
    if isinstance(periodic, dict) and (periodic.get("Spec") is not None or periodic.get("Specs") is not None):
        periodic["SpecType"] = "cron"
    if vault is not None:
        _normalize_vault(vault)
    if alone:
        job["TaskGroups"] = alone + _list_of_docs(job.get("TaskGroups"))
    for group in _list_of_docs(job.get("TaskGroups")):
        _normalize_ports(group.get("Networks"))
        for task in _list_of_docs(group.get("Tasks")):
            resources = task.get("Resources")
            if isinstance(resources, dict):
                _normalize_ports(resources.get("Networks"))
            _normalize_templates(task.get("Templates"))
            task_vault = task.get("Vault")
            if isinstance(task_vault, dict):
                _normalize_vault(task_vault)
            elif vault is not None:
                task["Vault"] = vault
            identities = _list_of_docs(task.get("Identities"))
            for i, wid in enumerate(identities):
                # COMPAT(1.7): the default identity moves to Task.Identity
                if wid.get("Name", "") in ("", "default"):
                    task["Identity"] = wid
                    rest = identities[:i] + identities[i + 1 :]
                    if rest:
                        task["Identities"] = rest
                    else:
                        task.pop("Identities", None)
                    break


def _normalize_vault(v: Doc) -> None:
    v.setdefault("Env", True)
    v.setdefault("DisableFile", False)
    v.setdefault("ChangeMode", "restart")


def _normalize_ports(networks: object) -> None:
    for n in _list_of_docs(networks):
        ports = _list_of_docs(n.get("DynamicPorts"))
        if not ports:
            continue
        reserved = [p for p in ports if _static(p)]
        dynamic = [p for p in ports if not _static(p)]
        if dynamic:
            n["DynamicPorts"] = dynamic
        else:
            n.pop("DynamicPorts", None)
        if reserved:
            n["ReservedPorts"] = reserved
        else:
            n.pop("ReservedPorts", None)


def _static(port: Doc) -> bool:
    value = port.get("Value")
    return isinstance(value, int) and value > 0


def _normalize_templates(templates: object) -> None:
    for t in _list_of_docs(templates):
        t.setdefault("ChangeMode", "restart")
        t.setdefault("Perms", "0644")
        t.setdefault("Splay", 5_000_000_000)
        t.setdefault("ErrMissingKey", False)
        script = t.get("ChangeScript")
        if isinstance(script, dict):
            script.setdefault("Args", [])
            script.setdefault("Timeout", 5_000_000_000)
            script.setdefault("FailOnError", False)
