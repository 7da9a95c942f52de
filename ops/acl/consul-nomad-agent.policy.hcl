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
