# Consul ACL policy of the Nomad agents' own Consul token (agent config consul { token }):
# a Nomad client registers the services and checks of the allocations it runs with its
# node's Consul agent. Only this token may write llmgw's service names: a registration
# of llmgw-engine is a replica routers send prompts to, llmgw-rank one a worker rank joins.
# Add the services of your other jobs.

service "llmgw-engine" {
  policy = "write"
}

service "llmgw-rank" {
  policy = "write"
}

# ops/llmgw.nomad.hcl's own services (ops/DEPLOY.md registers it with this token on the agents).
service "llmgw-router" {
  policy = "write"
}

service "llmgw-control-metrics" {
  policy = "write"
}

service "mirror" {
  policy = "write"
}
