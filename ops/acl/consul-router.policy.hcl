# Consul ACL policy of a router (its CONSUL_HTTP_TOKEN).

service "llmgw-engine" {
  policy = "read"
}

node_prefix "" {
  policy = "read" # health answers are filtered by node too (agent/consul/acl.go, filterCheckServiceNodes)
}

key "llmgw/catalog/current" {
  policy = "read"
}

key_prefix "llmgw/draining/" {
  policy = "read"
}

key "llmgw/unavailable" {
  policy = "read" # the models the control plane cannot serve now (unplaceable, drained)
}

key_prefix "llmgw/keys/" {
  policy = "read" # API key records: ids and SHA-256 digests, never secrets
}

key_prefix "llmgw/demand/" {
  policy = "write" # its own demand report
}

key_prefix "llmgw/responses/" {
  policy = "write" # the Responses API's stored conversations, shared by every router
}
