# Consul ACL policy for Prometheus's Consul service discovery (ops/prometheus/prometheus.yml).
# It reads llmgw's three services and their health: a health read needs service:read of the
# service and node:read of the nodes it runs on, or Consul filters the entries out without an
# error (agent/consul/acl.go, filterCheckServiceNodes). The scrape configuration names its
# datacenter, so Prometheus asks no /v1/agent/self and needs no agent rule.
#
#   consul acl policy create -name llmgw-prometheus -rules @ops/acl/consul-prometheus.hcl
#   consul acl token create -description "Prometheus (llmgw)" -policy-name llmgw-prometheus

service "llmgw-router" {
  policy = "read"
}

service "llmgw-control-metrics" {
  policy = "read"
}

service "llmgw-engine" {
  policy = "read"
}

node_prefix "" {
  policy = "read"
}
