"""Nomad's ACL policy and token endpoints, as an operator creates llmgw's tokens with them.

Owns: ``POST|PUT /v1/acl/policy/<name>`` for a policy without a ``JobACL`` (the
policies tokens carry: its whole ``Rules`` parsed as ``acl.Parse`` reads llmgw's
policy files) and ``POST|PUT /v1/acl/token`` (a client token naming policies, or a
management token), as ``ops/acl/apply.sh`` and ``ops/DEPLOY.md`` call them. A token
resolves its policies by name whenever one is applied, as Nomad resolves a token's
policies from the state store on every request (``nomad/acl.go``, ``ResolveACL``): a
policy applied after its token still counts, and a name no policy has gives nothing.
Both need a management token (``nomad/acl_endpoint.go``: ``UpsertPolicies`` and
``UpsertTokens`` check ``IsManagement``; the route table in ``authz.py`` does).

Answers as Nomad 2.0.5 does: the policy apply is 200 with an empty body
(``command/agent/acl_endpoint.go``, ``aclPolicyUpdate``, 400 "ACL policy name does
not match request path"); a token is the ``api.ACLToken`` JSON with its SecretID;
``ACLToken.Validate`` (``nomad/structs/acl.go``) refuses a client token without
policies or roles, a management token with them, and any other type, joined as a
multierror (400).

Must not: decide what a token may do (``NomadAcl`` does) or hold workload policies
(``variables.py`` keeps those written with a ``JobACL``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from llmgw.devcluster.acl import NomadAcl, PolicyProblem, parse_nomad_policy
from llmgw.devcluster.acl.nomad_rules import NomadPolicy
from llmgw.devcluster.acl.tokens import TokenBook, new_secret

if TYPE_CHECKING:
    from llmgw.devcluster.nomad.standin import NomadStandIn


@dataclass
class TokenPolicies:
    """The policies tokens carry, by name, and the tokens made over the API (secret -> record)."""

    policies: dict[str, tuple[str, str, NomadPolicy]] = field(
        default_factory=dict
    )  # name -> (desc, rules, parsed)
    tokens: dict[str, dict[str, object]] = field(default_factory=dict)

    def acl_of(self, names: list[str]) -> NomadAcl:
        return NomadAcl.of([self.policies[n][2] for n in names if n in self.policies])

    def refresh(self, book: TokenBook[NomadAcl]) -> None:
        """Every API token's ACL again from the policies as they are now."""
        for secret, record in self.tokens.items():
            if record["Type"] == "client":
                names = [str(n) for n in record["Policies"]]  # type: ignore[attr-defined]
                book.add(secret, f"token {record['Name']}", self.acl_of(names), str(record["AccessorID"]))


def _error(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain")


async def _object(request: web.Request) -> dict[str, object] | web.Response:
    try:
        raw = json.loads(await request.read() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"Request body could not be decoded: {exc}")
    if not isinstance(raw, dict):
        return _error(400, "Request body must be a JSON object")
    # Go's encoding/json matches field names case-insensitively.
    return {str(k).lower(): v for k, v in raw.items()}


async def apply_policy(request: web.Request, standin: NomadStandIn) -> web.Response:
    body = await _object(request)
    if isinstance(body, web.Response):
        return body
    name = request.match_info["name"]
    if body.get("name") and body["name"] != name:
        return _error(400, "ACL policy name does not match request path")
    rules = str(body.get("rules") or "")
    try:
        parsed = parse_nomad_policy(rules, name)
    except PolicyProblem as exc:
        return _error(400, f"1 error occurred:\n\t* Failed to parse rules: {exc}\n\n")
    book = standin.token_policies
    book.policies[name] = (str(body.get("description") or ""), rules, parsed)
    book.refresh(standin.tokens)
    return web.Response(status=200)


def _token_problems(kind: str, policies: list[str], roles: list[object]) -> list[str]:
    if kind == "client":
        return ["client token missing policies or roles"] if not policies and not roles else []
    if kind == "management":
        return ["management token cannot be associated with policies or roles"] if policies or roles else []
    return ["token type must be client or management"]


async def create_token(request: web.Request, standin: NomadStandIn) -> web.Response:
    body = await _object(request)
    if isinstance(body, web.Response):
        return body
    kind = str(body.get("type") or "")
    raw_policies = body.get("policies") or []
    raw_roles = body.get("roles") or []
    if not isinstance(raw_policies, list) or not isinstance(raw_roles, list):
        return _error(400, "Request body could not be decoded: Policies and Roles are lists")
    policies = [str(p) for p in raw_policies]
    problems = _token_problems(kind, policies, raw_roles)
    if raw_roles:
        problems.append("the dev stand-in keeps no ACL roles: name policies")
    if problems:
        listed = "".join(f"\t* {p}\n" for p in problems)
        return _error(400, f"{len(problems)} error{'s' if len(problems) > 1 else ''} occurred:\n{listed}\n")
    secret, accessor = new_secret(), new_secret()
    name = str(body.get("name") or "")
    index = standin.store.index + 1
    record: dict[str, object] = {
        "AccessorID": accessor,
        "SecretID": secret,
        "Name": name,
        "Type": kind,
        "Policies": policies,
        "Roles": [],
        "Global": bool(body.get("global")),
        "CreateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "CreateIndex": index,
        "ModifyIndex": index,
    }
    book = standin.token_policies
    book.tokens[secret] = record
    if kind == "management":
        standin.tokens.add(secret, f"token {name}", NomadAcl(management=True), accessor)
    else:
        book.refresh(standin.tokens)
    return web.json_response(record)
