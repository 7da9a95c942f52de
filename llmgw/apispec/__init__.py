"""Nomad's and Consul's API field lists as data, and the key-exact check.

Owns the vendored tables (``nomad-api-fields.json``, ``consul-api-fields.json``:
byte-identical copies of ``../shared/{nomad,consul}/api-fields.json``) and the pure
functions over them. Must not do I/O beyond reading its own packaged data, and
must not import the programs above it.
"""

from llmgw.apispec.checking import ApiDecodeError, KeyProblem, ProblemKind, check_document, decode_like_nomad
from llmgw.apispec.tables import (
    ApiName,
    ApiTables,
    FieldSpec,
    GoType,
    HclKind,
    HclTag,
    Kind,
    StructSpec,
    go_type,
    struct,
    tables,
)

__all__ = [
    "ApiDecodeError",
    "ApiName",
    "ApiTables",
    "FieldSpec",
    "GoType",
    "HclKind",
    "HclTag",
    "KeyProblem",
    "Kind",
    "ProblemKind",
    "StructSpec",
    "check_document",
    "decode_like_nomad",
    "go_type",
    "struct",
    "tables",
]
