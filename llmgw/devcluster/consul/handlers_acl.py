"""``/v1/acl/login``: a Nomad workload identity exchanged for a Consul token.

Owns the login as ``nomad setup consul`` configures it (Nomad 2.0.5
``command/setup_consul.go``): the JWT auth method verifies the identity's signature and
audience, the binding rule for tasks (selector ``"nomad_service" not in value``) binds
the role ``nomad-${value.nomad_namespace}-tasks``, and the token gets that role's
policies. No rule binding a role that exists is Consul's 403 ``Permission denied``.

Must not: hold the auth method (``ConsulState.auth_methods`` does).
"""

from __future__ import annotations

import json

from aiohttp import web

from llmgw.devcluster.acl import ConsulAcl
from llmgw.devcluster.acl.identity import IdentityInvalid, verify_identity
from llmgw.devcluster.acl.tokens import new_secret
from llmgw.devcluster.consul.http_common import json_answer, state_of


async def login(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    try:
        body = json.loads(await request.read() or b"{}")
    except json.JSONDecodeError as exc:
        return web.Response(status=400, text=f"Request decode failed: {exc}", content_type="text/plain")
    method = state.auth_methods.get(str(body.get("AuthMethod") or ""))
    if method is None:
        return web.Response(status=403, text="ACL not found", content_type="text/plain")
    try:
        claims = verify_identity(str(body.get("BearerToken") or ""), method.key, method.audience)
    except IdentityInvalid as exc:
        return web.Response(status=403, text=f"Permission denied: {exc}", content_type="text/plain")
    if "nomad_service" in claims:
        return web.Response(status=403, text="Permission denied", content_type="text/plain")
    role = f"nomad-{claims.get('nomad_namespace', '')}-tasks"
    policies = method.roles.get(role)
    if policies is None:
        return web.Response(status=403, text="Permission denied", content_type="text/plain")
    task = f"{claims.get('nomad_job_id', '')}/{claims.get('nomad_task', '')}"
    accessor = new_secret()
    secret = state.tokens.issue(f"task {task}", ConsulAcl.of(accessor, list(policies)), accessor)
    return json_answer({"AccessorID": accessor, "SecretID": secret, "Roles": [{"Name": role}]})
