# Consul ACL policy of llmgw's control plane (its CONSUL_HTTP_TOKEN).
# Consul acl/policy.go: an exact rule wins over a prefix rule, the longest prefix wins,
# write implies read, and anything no rule names is denied (default_policy = "deny").

key_prefix "llmgw/" {
  policy = "write" # catalog, history, status, unavailable models, drain marks, commands, API keys, the leader lock
}

service "llmgw-engine" {
  policy = "read" # the replicas' health
}

node_prefix "" {
  policy = "read" # health answers are filtered by node too (agent/consul/acl.go, filterCheckServiceNodes)
}

session_prefix "" {
  policy = "write" # the leader session, on the node of the agent llmgw talks to
}

service "llmgw-control" {
  policy = "write" # each instance's own TTL check on that agent, which its leader session is tied to
}
