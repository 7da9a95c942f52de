#!/bin/sh
# Create llmgw's ACL policies and tokens in an ACL-enabled Nomad and Consul, from the
# policy files beside this script, over the two HTTP APIs (curl and python3: no nomad
# or consul CLI needed). Run with a management token in NOMAD_TOKEN and
# CONSUL_HTTP_TOKEN, and NOMAD_ADDR, CONSUL_HTTP_ADDR (the CLIs' variables: NOMAD_CACERT,
# CONSUL_CACERT and CONSUL_HTTP_SSL are honoured too), once per cluster; running it
# again updates the policies, role, auth method and binding rule in place and creates new
# tokens. It prints each token's SecretID as NAME=SECRET lines (ops/DEPLOY.md, step 1).
#
#   NOMAD_JWKS_URL   Nomad's JWKS endpoint Consul verifies task identities against
#                    (https://<a Nomad server>:4646/.well-known/jwks.json)
#   NOMAD_JWKS_CA    the CA file of that endpoint's certificate (optional)
#
# The CLI equivalents, for reference: nomad acl policy apply, nomad acl token create,
# consul acl policy create|update, consul acl role create|update, consul acl
# auth-method create|update, consul acl binding-rule create, consul acl token create.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${NOMAD_ADDR:?set NOMAD_ADDR}" "${NOMAD_TOKEN:?set NOMAD_TOKEN to a management token}"
: "${CONSUL_HTTP_ADDR:?set CONSUL_HTTP_ADDR}" "${CONSUL_HTTP_TOKEN:?set CONSUL_HTTP_TOKEN to a management token}"
: "${NOMAD_JWKS_URL:?set NOMAD_JWKS_URL to Nomad's https://HOST:4646/.well-known/jwks.json}"

# CONSUL_HTTP_ADDR may omit the scheme, as the consul CLI allows (CONSUL_HTTP_SSL picks https).
case "$CONSUL_HTTP_ADDR" in
  http://* | https://*) consul_url=$CONSUL_HTTP_ADDR ;;
  *) if [ "${CONSUL_HTTP_SSL:-false}" = true ]; then consul_url=https://$CONSUL_HTTP_ADDR; else consul_url=http://$CONSUL_HTTP_ADDR; fi ;;
esac

# One request; its answer on stdout; an HTTP error stops the script with the server's words.
call() { # NAME URL-BASE TOKEN-HEADER CACERT METHOD PATH [BODY]
  answer=$(curl -sS ${4:+--cacert "$4"} -X "$5" -H "$3" ${7:+--data-binary "$7"} -w '\n%{http_code}' "$2$6")
  code=${answer##*
}
  answer=${answer%
*}
  case "$code" in
    2??) printf '%s\n' "$answer" ;;
    *) printf '%s %s %s: %s %s\n' "$1" "$5" "$6" "$code" "$answer" >&2 && return 1 ;;
  esac
}
nomad_api() { call Nomad "$NOMAD_ADDR" "X-Nomad-Token: $NOMAD_TOKEN" "${NOMAD_CACERT:-}" "$@"; }
consul_api() { call Consul "$consul_url" "X-Consul-Token: $CONSUL_HTTP_TOKEN" "${CONSUL_CACERT:-}" "$@"; }
# mk EXPR ARG...: a JSON body from a Python expression over the arguments (a[0], a[1], ...).
mk() { python3 -c 'import json, sys; a = sys.argv[2:]; print(json.dumps(eval(sys.argv[1])))' "$@"; }
# get EXPR ARG...: a Python expression over a JSON answer on stdin (doc) and the arguments.
get() {
  python3 -c 'import json, sys; a = sys.argv[2:]; doc = json.load(sys.stdin); r = eval(sys.argv[1])
print(r if isinstance(r, str) else json.dumps(r))' "$@"
}
# The ID of the object named $1 in a Consul list answer on stdin, or nothing.
id_named() { get 'next((o["ID"] for o in doc if o["Name"] == a[0]), "")' "$1"; }

# --- Nomad: policies (POST /v1/acl/policy/:name creates or updates) and client tokens
for who in control-plane router ci; do
  nomad_api POST "/v1/acl/policy/llmgw-$who" \
    "$(mk '{"Name": a[0], "Description": a[1], "Rules": open(a[2]).read()}' \
      "llmgw-$who" "llmgw $who" "$here/nomad-$who.policy.hcl")" >/dev/null
done
nomad_token() {
  nomad_api POST /v1/acl/token \
    "$(mk '{"Name": "llmgw " + a[0], "Type": "client", "Policies": ["llmgw-" + a[0]]}' "$1")" |
    get 'doc["SecretID"]'
}
echo "control_nomad_token=$(nomad_token control-plane)"
echo "router_nomad_token=$(nomad_token router)"
echo "ci_nomad_token=$(nomad_token ci)"

# --- Consul: policies (PUT /v1/acl/policy creates, PUT /v1/acl/policy/:id updates)
consul_policy() { # NAME FILE
  id=$(consul_api GET /v1/acl/policies | id_named "$1")
  consul_api PUT "/v1/acl/policy${id:+/$id}" \
    "$(mk '{"Name": a[0], "Rules": open(a[1]).read()}' "$1" "$2")" >/dev/null
}
for who in control-plane router status nomad-agent; do
  consul_policy "llmgw-$who" "$here/consul-$who.policy.hcl"
done
consul_policy llmgw-prometheus "$here/consul-prometheus.hcl"
# The engines' tasks: nomad setup consul's names (command/setup_consul.go, Nomad 2.0.5).
consul_policy policy-nomad-tasks "$here/consul-engine-tasks.policy.hcl"
id=$(consul_api GET /v1/acl/roles | id_named nomad-default-tasks)
consul_api PUT "/v1/acl/role${id:+/$id}" \
  "$(mk '{"Name": "nomad-default-tasks", "Policies": [{"Name": "policy-nomad-tasks"}]}')" >/dev/null

# --- Consul: the JWT auth method task identities log in with, and its binding rule
method=$(mk '{"Name": "nomad-workloads", "Type": "jwt", "MaxTokenTTL": "30m", "TokenLocality": "local",
  "Config": {**json.load(open(a[0])), "JWKSURL": a[1], "JWKSCACert": open(a[2]).read() if a[2] else ""}}' \
  "$here/consul-auth-method.json" "$NOMAD_JWKS_URL" "${NOMAD_JWKS_CA:-}")
if consul_api GET /v1/acl/auth-methods | get 'any(m["Name"] == "nomad-workloads" for m in doc)' | grep -qx true; then
  consul_api PUT /v1/acl/auth-method/nomad-workloads "$method" >/dev/null
else
  consul_api PUT /v1/acl/auth-method "$method" >/dev/null
fi
if ! consul_api GET "/v1/acl/binding-rules?authmethod=nomad-workloads" | get 'len(doc)' | grep -qv '^0$'; then
  consul_api PUT /v1/acl/binding-rule "$(mk '{"AuthMethod": "nomad-workloads", "BindType": "role",
    "BindName": "nomad-${value.nomad_namespace}-tasks", "Selector": "\"nomad_service\" not in value"}')" >/dev/null
fi

consul_token() {
  consul_api PUT /v1/acl/token "$(mk '{"Description": a[1], "Policies": [{"Name": a[0]}]}' "$1" "$2")" |
    get 'doc["SecretID"]'
}
echo "control_consul_token=$(consul_token llmgw-control-plane "llmgw control-plane")"
echo "router_consul_token=$(consul_token llmgw-router "llmgw router")"
echo "status_consul_token=$(consul_token llmgw-status "llmgw status")"
echo "nomad_agent_consul_token=$(consul_token llmgw-nomad-agent "Nomad agents (llmgw)")"
echo "prometheus_consul_token=$(consul_token llmgw-prometheus "Prometheus (llmgw)")"
