"""Consul's ACL objects an operator creates over the HTTP API: policies, roles, tokens,
the JWT auth method and its binding rule, as ``ops/acl/apply.sh`` creates llmgw's.

Owns: ``PUT /v1/acl/policy`` (create) and ``/v1/acl/policy/<id>`` (update),
``GET /v1/acl/policies``; the same for roles (``/v1/acl/role``, ``/v1/acl/roles``);
``PUT /v1/acl/auth-method`` and ``/v1/acl/auth-method/<name>``, ``GET
/v1/acl/auth-methods``; ``PUT /v1/acl/binding-rule``, ``GET /v1/acl/binding-rules``;
``PUT /v1/acl/token`` (a token of policies by name). Every one needs a management
token here (Consul: ``acl:write``/``acl:read``; ``agent/acl_endpoint.go``). Policies
are parsed as ``parse_consul_policy`` reads llmgw's policy files (400 with the reason
otherwise). A token and a role resolve their policies by name when they are made and
again whenever a policy changes, as Consul resolves a token's policy links at request
time (``agent/consul/acl.go``).

The auth method: Consul verifies a login's JWT against the keys at the method's
``JWKSURL``. The stand-ins sign with a shared key instead (``acl/identity.py``), which
``DevCluster`` registers under the Nomad stand-in's JWKS URL (``AclObjects.jwks_keys``);
a method naming any other URL gets a key no identity is signed with, so its logins
fail as a real login against the wrong JWKS does. Binding rules: the one form
``nomad setup consul`` writes (``command/setup_consul.go``, Nomad 2.0.5): bind type
``role``, a bind name that interpolates ``${value.nomad_namespace}``, selector
``"nomad_service" not in value``; any other is refused with a 400 saying so (the
stand-in evaluates no other selector). The login itself is ``handlers_acl.login``.

Must not: decide what a token may do (``ConsulAcl`` does).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.devcluster.acl import ConsulAcl, PolicyProblem, parse_consul_policy
from llmgw.devcluster.acl.consul_rules import ConsulPolicy
from llmgw.devcluster.acl.tokens import new_secret
from llmgw.devcluster.consul.acl_objects import AclObjects
from llmgw.devcluster.consul.http_common import json_answer, state_of
from llmgw.devcluster.consul.state import AuthMethod, ConsulState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TASK_SELECTOR = '"nomad_service" not in value'
NAMESPACE_INTERPOLATION = "${value.nomad_namespace}"


def objects_of(state: ConsulState) -> AclObjects:
    return state.acl_objects


async def _body(request: web.Request, what: str) -> dict[str, object]:
    try:
        raw = json.loads(await request.read() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise web.HTTPBadRequest(text=f"{what} decoding failed: {exc}", content_type="text/plain") from exc
    if not isinstance(raw, dict):
        raise web.HTTPBadRequest(text=f"{what} decoding failed: not an object", content_type="text/plain")
    return raw


def _bad(text: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=text, content_type="text/plain")


def _names(links: object) -> list[str]:
    if not isinstance(links, list):
        return []
    return [str(link.get("Name") or "") for link in links if isinstance(link, dict)]


def _policies_of(objects: AclObjects, names: list[str]) -> list[ConsulPolicy]:
    return [objects.parsed[n] for n in names if n in objects.parsed]


def _relink(state: ConsulState) -> None:
    """Tokens and auth methods again from the policies and roles as they are now."""
    objects = objects_of(state)
    for secret, token in objects.tokens.items():
        accessor = str(token["AccessorID"])
        acl = ConsulAcl.of(accessor, _policies_of(objects, _names(token["Policies"])))
        state.tokens.add(secret, f"token {token['Description']}", acl, accessor)
    for name, method in objects.methods.items():
        config = method.get("Config")
        url = str(config.get("JWKSURL") or "") if isinstance(config, dict) else ""
        audiences = config.get("BoundAudiences") if isinstance(config, dict) else None
        audience = str(audiences[0]) if isinstance(audiences, list) and audiences else ""
        bound: dict[str, tuple[ConsulPolicy, ...]] = {}
        for rule in objects.rules.values():
            if rule["AuthMethod"] != name:
                continue
            prefix, _, suffix = str(rule["BindName"]).partition(NAMESPACE_INTERPOLATION)
            for role in objects.roles.values():
                role_name = str(role["Name"])
                if role_name.startswith(prefix) and role_name.endswith(suffix):
                    bound[role_name] = tuple(_policies_of(objects, _names(role["Policies"])))
        key = objects.jwks_keys.get(url) or secrets.token_bytes(32)
        state.auth_methods[name] = AuthMethod(key=key, audience=audience, roles=bound)


def _stamp(state: ConsulState, record: dict[str, object], created: bool) -> None:
    index = state.index + 1
    if created:
        record["CreateIndex"] = index
    record["ModifyIndex"] = index


async def policy_write(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    objects = objects_of(state)
    body = await _body(request, "Policy")
    policy_id = request.match_info.get("policy_id", "")
    if not policy_id and body.get("ID"):
        raise _bad("Cannot specify the ID when creating a new policy")
    if policy_id and policy_id not in objects.policies:
        raise _bad(f"Invalid Policy: A Policy with ID {policy_id!r} does not exist")
    name = str(body.get("Name") or "")
    same_name = next((p for p in objects.policies.values() if p["Name"] == name), None)
    if same_name is not None and same_name["ID"] != (policy_id or None):
        raise _bad(f'Invalid Policy: A Policy with Name "{name}" already exists')
    rules = str(body.get("Rules") or "")
    try:
        parsed = parse_consul_policy(rules, name)
    except PolicyProblem as exc:
        raise _bad(f"Invalid Policy: {exc}") from exc
    old = objects.policies.get(policy_id, {})
    record: dict[str, object] = {
        **old,
        "ID": policy_id or new_secret(),
        "Name": name,
        "Description": str(body.get("Description") or ""),
        "Rules": rules,
        "Datacenters": body.get("Datacenters") or None,
        "Hash": hashlib.sha256(rules.encode()).hexdigest(),
    }
    if old:
        objects.parsed.pop(str(old["Name"]), None)
    _stamp(state, record, not old)
    objects.policies[str(record["ID"])] = record
    objects.parsed[name] = parsed
    _relink(state)
    return json_answer(record)


async def policy_list(request: web.Request) -> web.StreamResponse:
    objects = objects_of(state_of(request))
    return json_answer([{k: v for k, v in p.items() if k != "Rules"} for p in objects.policies.values()])


async def role_write(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    objects = objects_of(state)
    body = await _body(request, "Role")
    role_id = request.match_info.get("role_id", "")
    if role_id and role_id not in objects.roles:
        raise _bad(f"Invalid Role: A Role with ID {role_id!r} does not exist")
    name = str(body.get("Name") or "")
    if not name:
        raise _bad("Invalid Role: no Name is set")
    same_name = next((r for r in objects.roles.values() if r["Name"] == name), None)
    if same_name is not None and same_name["ID"] != (role_id or None):
        raise _bad(f'Invalid Role: A Role with Name "{name}" already exists')
    links = []
    for policy_name in _names(body.get("Policies")):
        found = next((p for p in objects.policies.values() if p["Name"] == policy_name), None)
        if found is None:
            raise _bad(f"cannot resolve policy name {policy_name!r}")
        links.append({"ID": found["ID"], "Name": policy_name})
    old = objects.roles.get(role_id, {})
    record: dict[str, object] = {
        **old,
        "ID": role_id or new_secret(),
        "Name": name,
        "Description": str(body.get("Description") or ""),
        "Policies": links,
    }
    _stamp(state, record, not old)
    objects.roles[str(record["ID"])] = record
    _relink(state)
    return json_answer(record)


async def role_list(request: web.Request) -> web.StreamResponse:
    return json_answer(list(objects_of(state_of(request)).roles.values()))


async def auth_method_write(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    objects = objects_of(state)
    body = await _body(request, "AuthMethod")
    name = request.match_info.get("name", "") or str(body.get("Name") or "")
    updating = "name" in request.match_info
    if updating and name not in objects.methods:
        raise _bad(f"Invalid Auth Method: auth method {name!r} does not exist")
    if not updating and name in objects.methods:
        raise _bad(f'Invalid Auth Method: A Auth Method with Name "{name}" already exists')
    if str(body.get("Type") or objects.methods.get(name, {}).get("Type") or "") != "jwt":
        raise _bad("the dev stand-in keeps only auth methods of type jwt")
    config = body.get("Config")
    if not isinstance(config, dict) or not config.get("JWKSURL"):
        raise _bad(
            "Invalid Auth Method: exactly one of JWTValidationPubKeys, JWKSURL, "
            "or OIDCDiscoveryURL is required"
        )
    old = objects.methods.get(name, {})
    record: dict[str, object] = {
        **old,
        "Name": name,
        "Type": "jwt",
        "DisplayName": str(body.get("DisplayName") or ""),
        "Description": str(body.get("Description") or ""),
        "MaxTokenTTL": str(body.get("MaxTokenTTL") or old.get("MaxTokenTTL") or "0s"),
        "TokenLocality": str(body.get("TokenLocality") or old.get("TokenLocality") or ""),
        "Config": config,
    }
    _stamp(state, record, not old)
    objects.methods[name] = record
    _relink(state)
    return json_answer(record)


async def auth_method_list(request: web.Request) -> web.StreamResponse:
    methods = objects_of(state_of(request)).methods.values()
    return json_answer([{k: v for k, v in m.items() if k != "Config"} for m in methods])


async def binding_rule_write(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    objects = objects_of(state)
    body = await _body(request, "BindingRule")
    method = str(body.get("AuthMethod") or "")
    if method not in objects.methods:
        raise _bad(f"Invalid Binding Rule: no such auth method {method!r}")
    bind_type, bind_name = str(body.get("BindType") or ""), str(body.get("BindName") or "")
    if (
        bind_type != "role"
        or NAMESPACE_INTERPOLATION not in bind_name
        or body.get("Selector") != TASK_SELECTOR
    ):
        raise _bad(
            "the dev stand-in evaluates one binding rule: BindType role, a BindName with "
            f"{NAMESPACE_INTERPOLATION}, Selector {TASK_SELECTOR}"
        )
    record: dict[str, object] = {
        "ID": new_secret(),
        "Description": str(body.get("Description") or ""),
        "AuthMethod": method,
        "Selector": TASK_SELECTOR,
        "BindType": bind_type,
        "BindName": bind_name,
    }
    _stamp(state, record, True)
    objects.rules[str(record["ID"])] = record
    _relink(state)
    return json_answer(record)


async def binding_rule_list(request: web.Request) -> web.StreamResponse:
    method = request.query.get("authmethod", "")
    rules = objects_of(state_of(request)).rules.values()
    return json_answer([r for r in rules if not method or r["AuthMethod"] == method])


async def token_create(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    objects = objects_of(state)
    body = await _body(request, "Token")
    if body.get("Roles") or body.get("ServiceIdentities") or body.get("NodeIdentities"):
        raise _bad("the dev stand-in makes tokens of policies only")
    links = []
    for policy_name in _names(body.get("Policies")):
        found = next((p for p in objects.policies.values() if p["Name"] == policy_name), None)
        if found is None:
            raise _bad(f"cannot resolve policy name {policy_name!r}")
        links.append({"ID": found["ID"], "Name": policy_name})
    secret, accessor = new_secret(), new_secret()
    record: dict[str, object] = {
        "AccessorID": accessor,
        "SecretID": secret,
        "Description": str(body.get("Description") or ""),
        "Policies": links,
        "Local": bool(body.get("Local")),
    }
    _stamp(state, record, True)
    objects.tokens[secret] = record
    _relink(state)
    return json_answer(record)


ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("PUT", "/v1/acl/policy", policy_write),
    ("PUT", "/v1/acl/policy/{policy_id}", policy_write),
    ("GET", "/v1/acl/policies", policy_list),
    ("PUT", "/v1/acl/role", role_write),
    ("PUT", "/v1/acl/role/{role_id}", role_write),
    ("GET", "/v1/acl/roles", role_list),
    ("PUT", "/v1/acl/auth-method", auth_method_write),
    ("PUT", "/v1/acl/auth-method/{name}", auth_method_write),
    ("GET", "/v1/acl/auth-methods", auth_method_list),
    ("PUT", "/v1/acl/binding-rule", binding_rule_write),
    ("GET", "/v1/acl/binding-rules", binding_rule_list),
    ("PUT", "/v1/acl/token", token_create),
)
