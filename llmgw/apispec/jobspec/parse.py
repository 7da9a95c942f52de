"""``parse_jobspec``: HCL text in, Nomad's api.Job JSON out, as ``POST /v1/jobs/parse`` answers.

Owns the top level of a jobspec as jobspec2 reads it: the ``variable``,
``variables``, ``locals`` and ``job`` blocks, variable values passed in (the
request's ``Variables``), the evaluation context (``var``, ``local``, the function
table, unknown references kept as ``${...}``), and collecting every diagnostic
into one :class:`JobspecError`.

Must not: do I/O. Nothing here reads files or the environment (jobspec2 on the
server runs with AllowFS false, and the agent's environment is not the caller's).
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.apispec.jobspec.canonical import canonicalize_job
from llmgw.apispec.jobspec.decoding import Decoder, decode_job
from llmgw.apispec.jobspec.diagnostics import Diagnostic, JobspecError, SourceMap, SyntaxProblem
from llmgw.apispec.jobspec.expressions import (
    Context,
    ConversionError,
    Expr,
    FunctionCall,
    ObjectCons,
    Traversal,
    TupleCons,
    Value,
    to_bool,
    to_number,
    to_string,
)
from llmgw.apispec.jobspec.functions import FUNCTIONS
from llmgw.apispec.jobspec.syntax import Block, Body, parse

# A variable type constraint: ("string",), ("list", t), ("map", t), ("object", {k: t}),
# ("tuple", [t]) or ("any",)
TypeSpec = tuple[object, ...]

_TOP_BLOCKS: Mapping[str, tuple[str, ...]] = {
    "variables": (),
    "variable": ("name",),
    "locals": (),
    "job": ("name",),
}


def parse_jobspec(
    text: str,
    *,
    filename: str = "job.nomad.hcl",
    variables: Mapping[str, object] | None = None,
    variables_file: str = "",
    canonicalize: bool = False,
) -> dict[str, object]:
    """Parse a Nomad HCL2 jobspec into the api.Job JSON that ``/v1/jobs/parse`` returns.

    ``variables`` are values for the jobspec's ``variable`` blocks (like the parse
    request's ``Variables``); ``canonicalize`` fills the api package's Canonicalize
    defaults for the fields llmgw's templates use (see DESIGN.md). Unset fields are
    omitted. ``variables_file`` is the text of a variables file (the parse request's
    ``Variables``, jobspec2's ``VarContent``): ``name = value`` lines, below
    ``variables`` in precedence; a name it sets that the jobspec does not declare is
    only a warning in jobspec2 (``collectInputVariableValues``), so it is dropped.
    Raises :class:`JobspecError` with every diagnostic found.
    """
    smap = SourceMap(text, filename)
    try:
        body = parse(text, filename)
    except SyntaxProblem as p:
        raise JobspecError([smap.diag(p.offset, p.summary, p.detail)]) from None

    dec = Decoder(smap, Context({"var": {}, "local": {}}, FUNCTIONS))
    job_blocks = _top_level(dec, body)
    if dec.diags:
        raise JobspecError(dec.diags)

    passed = dict(_variables_file(variables_file, body)) if variables_file else {}
    passed.update(variables or {})
    var_values = _input_variables(dec, body, passed)
    dec.ctx.variables["var"] = var_values
    if dec.diags:
        raise JobspecError(dec.diags)
    dec.ctx.variables["local"] = _locals(dec, body)
    if dec.diags:
        raise JobspecError(dec.diags)

    if not job_blocks:
        raise JobspecError([Diagnostic(filename, 0, 0, "Missing job block", "A job block is required")])
    if len(job_blocks) > 1:
        first = job_blocks[0]
        line, col = smap.position(first.type_start)
        for extra in job_blocks[1:]:
            dec.error(
                extra.type_start,
                "Duplicate job block",
                'Only one block of type "job" is allowed. '
                f"Previous definition was at {filename}:{line},{col}.",
            )
    job = decode_job(dec, job_blocks[0])
    if dec.diags:
        raise JobspecError(dec.diags)
    if canonicalize:
        canonicalize_job(job)
    return job


def _top_level(dec: Decoder, body: Body) -> list[Block]:
    """jobConfigSchema: only variable(s), locals and job blocks at the top."""
    for name, attr in body.attributes.items():
        dec.error(
            attr.name_start, "Unsupported argument", f'An argument named "{name}" is not expected here.'
        )
    jobs: list[Block] = []
    for b in body.blocks:
        names = _TOP_BLOCKS.get(b.type)
        if names is None:
            dec.error(
                b.type_start, "Unsupported block type", f'Blocks of type "{b.type}" are not expected here.'
            )
            continue
        if not dec._labels_ok(b, names):
            continue
        if b.type == "job":
            jobs.append(b)
    return jobs


# ------------------------------------------------------------------ variables


def _type_spec(expr: Expr) -> TypeSpec:
    if isinstance(expr, Traversal) and not expr.steps and expr.root in ("string", "number", "bool", "any"):
        return (expr.root,)
    if isinstance(expr, FunctionCall) and len(expr.args) == 1:
        arg = expr.args[0]
        if expr.name in ("list", "set", "map"):
            return ("list" if expr.name == "set" else expr.name, _type_spec(arg))
        if expr.name == "object" and isinstance(arg, ObjectCons):
            fields: dict[str, TypeSpec] = {}
            for k, v in arg.items:
                key = (
                    k.eval(Context({}, {}, unknown_as_text=False)) if not isinstance(k, Traversal) else k.root
                )
                fields[str(key)] = _type_spec(v)
            return ("object", fields)
        if expr.name == "tuple" and isinstance(arg, TupleCons):
            return ("tuple", [_type_spec(i) for i in arg.items])
    raise SyntaxProblem(
        expr.start,
        "Invalid type specification",
        "The keyword or function call is not a valid type specification.",
    )


def _convert_type(value: Value, t: TypeSpec) -> Value:
    kind = t[0]
    if value is None or kind == "any":
        return value
    if kind == "string":
        return to_string(value)
    if kind == "number":
        return to_number(value)
    if kind == "bool":
        return to_bool(value)
    if kind == "list":
        if not isinstance(value, list):
            raise ConversionError("list required")
        elem = t[1]
        assert isinstance(elem, tuple)
        return [_convert_type(v, elem) for v in value]
    if kind == "map":
        if not isinstance(value, dict):
            raise ConversionError("map required")
        elem = t[1]
        assert isinstance(elem, tuple)
        return {k: _convert_type(v, elem) for k, v in value.items()}
    if kind == "object":
        fields = t[1]
        assert isinstance(fields, dict)
        if not isinstance(value, dict):
            raise ConversionError("object required")
        missing = [k for k in fields if k not in value]
        if missing:
            raise ConversionError(f'attribute "{missing[0]}" is required')
        return {k: _convert_type(value[k], ft) for k, ft in fields.items()}
    if kind == "tuple":
        elems = t[1]
        assert isinstance(elems, list)
        if not isinstance(value, list) or len(value) != len(elems):
            raise ConversionError(f"tuple required with {len(elems)} elements")
        return [_convert_type(v, et) for v, et in zip(value, elems, strict=True)]
    return value


def _variables_file(text: str, body: Body) -> dict[str, Value]:
    """The values a variables file sets for variables the jobspec declares."""
    where = SourceMap(text, "variables.hcl")
    try:
        parsed = parse(text, "variables.hcl")
    except SyntaxProblem as p:
        raise JobspecError([where.diag(p.offset, p.summary, p.detail)]) from None
    declared = {b.labels[0] for b in body.blocks if b.type == "variable"}
    bare = Context({}, FUNCTIONS, unknown_as_text=False)
    out: dict[str, Value] = {}
    for name, attr in parsed.attributes.items():
        if name in declared:
            try:
                out[name] = attr.expr.eval(bare)
            except SyntaxProblem as p:
                raise JobspecError(
                    [SourceMap(text, "variables.hcl").diag(p.offset, p.summary, p.detail)]
                ) from None
    return out


def _input_variables(dec: Decoder, body: Body, passed: Mapping[str, object]) -> dict[str, Value]:
    """decodeInputVariables + collectInputVariableValues for values handed in by the caller."""
    bare = Context({}, FUNCTIONS, unknown_as_text=False)  # jobspec2 evaluates defaults with no context
    declared: dict[str, tuple[TypeSpec | None, list[Value], Block | None, int]] = {}
    for b in body.blocks:
        if b.type == "variable":
            name = b.labels[0]
            if name in declared:
                dec.error(b.type_start, "Duplicate variable", f"Duplicate {name} variable definition found.")
                continue
            attrs = b.body.attributes
            for aname, attr in attrs.items():
                if aname not in ("description", "default", "type"):
                    dec.error(
                        attr.name_start,
                        "Unsupported argument",
                        f'An argument named "{aname}" is not expected here.',
                    )
            for inner in b.body.blocks:
                if inner.type != "validation":
                    dec.error(
                        inner.type_start,
                        "Unsupported block type",
                        f'Blocks of type "{inner.type}" are not expected here.',
                    )
            type_spec: TypeSpec | None = None
            if "type" in attrs:
                try:
                    type_spec = _type_spec(attrs["type"].expr)
                except SyntaxProblem as p:
                    dec.problem(p)
                    continue
            values: list[Value] = []
            if "default" in attrs:
                expr = attrs["default"].expr
                try:
                    default = expr.eval(bare)
                except SyntaxProblem as p:
                    dec.problem(p)
                    continue
                if type_spec is not None:
                    try:
                        default = _convert_type(default, type_spec)
                    except ConversionError as e:
                        dec.error(
                            expr.start,
                            "Invalid default value for variable",
                            f"This default value is not compatible with the variable's type constraint: {e}.",
                        )
                        continue
                values.append(default)
            declared[name] = (type_spec, values, b, b.type_start)
        elif b.type == "variables":
            for inner in b.body.blocks:
                dec.error(
                    inner.type_start, f'Unexpected "{inner.type}" block', "Blocks are not allowed here."
                )
            for aname, attr in b.body.attributes.items():
                if aname in declared:
                    dec.error(
                        attr.name_start, "Duplicate variable", f"Duplicate {aname} variable definition found."
                    )
                    continue
                try:
                    declared[aname] = (None, [attr.expr.eval(bare)], None, attr.name_start)
                except SyntaxProblem as p:
                    dec.problem(p)
    for name, value in passed.items():
        if name not in declared:
            dec.diags.append(
                Diagnostic(
                    dec.smap.filename,
                    0,
                    0,
                    "Undefined variable",
                    f'A "{name}" variable was set but was not found in known variables. To declare variable '
                    f'"{name}", place this block in your job file: variable "{name}" {{}}',
                )
            )
            continue
        type_spec, values, _, start = declared[name]
        try:
            values.append(_convert_type(value, type_spec) if type_spec is not None else value)
        except ConversionError as e:
            dec.error(
                start, "Invalid value for variable", f'The value given for "{name}" is not suitable: {e}.'
            )
    out: dict[str, Value] = {}
    for name, (_, values, _, start) in declared.items():
        if not values:
            dec.error(
                start,
                f'Unset variable "{name}"',
                "A used variable must be set or have a default value; see "
                "https://www.nomadproject.io/docs/job-specification/hcl2/variables for details.",
            )
            continue
        out[name] = values[-1]
    return out


def _locals(dec: Decoder, body: Body) -> dict[str, Value]:
    """parseLocalVariables + evaluateLocalVariables: retry until every local resolves."""
    pending: list[tuple[str, Expr, int]] = []
    seen: set[str] = set()
    for b in body.blocks:
        if b.type != "locals":
            continue
        for inner in b.body.blocks:
            dec.error(inner.type_start, f'Unexpected "{inner.type}" block', "Blocks are not allowed here.")
        for name, attr in b.body.attributes.items():
            if name in seen:
                dec.error(attr.name_start, "Duplicate value in locals", f"Duplicate {name} definition found.")
                return {}
            seen.add(name)
            pending.append((name, attr.expr, attr.name_start))
    values: dict[str, Value] = {}
    dec.ctx.variables["local"] = values
    stalled = 0
    while pending and stalled <= len(pending):
        name, expr, start = pending.pop(0)
        try:
            values[name] = expr.eval(dec.ctx)
            stalled = 0
        except SyntaxProblem as p:
            if not pending:
                dec.problem(p)
                return values
            pending.append((name, expr, start))
            stalled += 1
            if stalled > len(pending):
                dec.problem(p)
                return values
    return values
