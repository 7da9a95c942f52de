#!/bin/sh
# Create llmgw's ACL policies and tokens in an ACL-enabled Nomad and Consul, from the
# policy files beside this script. Run with a management token in NOMAD_TOKEN and
# CONSUL_HTTP_TOKEN (and NOMAD_ADDR, CONSUL_HTTP_ADDR), once per cluster; running it
# again updates the policies and creates new tokens. It prints each token's SecretID
# as NAME=SECRET lines for `nomad var put nomad/jobs/llmgw ...` (ops/README.md).
#
#   NOMAD_JWKS_URL   Nomad's JWKS endpoint Consul verifies task identities against
#                    (https://<a Nomad server>:4646/.well-known/jwks.json)
#   NOMAD_JWKS_CA    the CA file of that endpoint's certificate (optional)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${NOMAD_JWKS_URL:?set NOMAD_JWKS_URL to Nomad's https://HOST:4646/.well-known/jwks.json}"

# --- Nomad: policies and tokens
for who in control-plane router ci; do
  nomad acl policy apply -description "llmgw $who" "llmgw-$who" "$here/nomad-$who.policy.hcl"
done
nomad_token() {
  nomad acl token create -name "llmgw $1" -type client -policy "llmgw-$1" -json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["SecretID"])'
}
echo "control_nomad_token=$(nomad_token control-plane)"
echo "router_nomad_token=$(nomad_token router)"
echo "ci_nomad_token=$(nomad_token ci)"

# --- Consul: policies (create, or update when it exists)
consul_policy() {
  consul acl policy create -name "$1" -rules "@$2" >/dev/null 2>&1 ||
    consul acl policy update -name "$1" -rules "@$2" >/dev/null
}
for who in control-plane router status nomad-agent; do
  consul_policy "llmgw-$who" "$here/consul-$who.policy.hcl"
done
# The engines' tasks: nomad setup consul's names (command/setup_consul.go, Nomad 2.0.5).
consul_policy policy-nomad-tasks "$here/consul-engine-tasks.policy.hcl"
consul acl role create -name nomad-default-tasks -policy-name policy-nomad-tasks >/dev/null 2>&1 ||
  consul acl role update -name nomad-default-tasks -policy-name policy-nomad-tasks >/dev/null

# --- Consul: the JWT auth method task identities log in with, and its binding rules
config=$(python3 - "$here/consul-auth-method.json" <<'PY'
import json, os, sys
config = json.load(open(sys.argv[1]))
config["JWKSURL"] = os.environ["NOMAD_JWKS_URL"]
ca = os.environ.get("NOMAD_JWKS_CA", "")
config["JWKSCACert"] = open(ca).read() if ca else ""
print(json.dumps(config))
PY
)
consul acl auth-method create -type jwt -name nomad-workloads -max-token-ttl 30m \
  -token-locality local -config "$config" >/dev/null 2>&1 ||
  consul acl auth-method update -name nomad-workloads -config "$config" >/dev/null
if ! consul acl binding-rule list -method nomad-workloads -format json | grep -q nomad-default-tasks; then
  consul acl binding-rule create -method nomad-workloads -bind-type role \
    -bind-name 'nomad-${value.nomad_namespace}-tasks' -selector '"nomad_service" not in value' >/dev/null
fi

consul_token() {
  consul acl token create -description "llmgw $1" -policy-name "llmgw-$1" -format json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["SecretID"])'
}
echo "control_consul_token=$(consul_token control-plane)"
echo "router_consul_token=$(consul_token router)"
echo "status_consul_token=$(consul_token status)"
echo "nomad_agent_consul_token=$(consul_token nomad-agent)"
