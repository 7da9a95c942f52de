# Consul ACL policy of the Nomad agents' own Consul token (agent config consul { token }):
# a Nomad client registers the services and checks of the allocations it runs with its
# node's Consul agent. Only this token may write llmgw's service names: a registration
# of llmgw-engine is a replica routers send prompts to, llmgw-rank one a worker rank joins.
# The llmgw job (ops/llmgw.nomad.hcl) registers llmgw-router and llmgw-control-metrics;
# add the services of your other jobs (the mirror's "mirror", if you run it).

service "llmgw-engine" {
  policy = "write"
}

service "llmgw-rank" {
  policy = "write"
}

service "llmgw-router" {
  policy = "write"
}

service "llmgw-control-metrics" {
  policy = "write"
}

# Only for clients that set template { use_client_consul_token = true } (ops/DEPLOY.md):
# their tasks' templates then read Consul with this token, and a worker rank's template
# reads llmgw-rank's health, which Consul filters by node (agent/consul/acl.go,
# filterCheckServiceNodes). Writing a service grants reading it; reading nodes is this.
node_prefix "" {
  policy = "read"
}
