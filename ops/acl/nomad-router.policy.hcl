# Nomad ACL policy of a router (its NOMAD_TOKEN): it follows the allocations of llmgw's
# jobs and the nodes' status on the event stream and writes nothing.
# Nomad 2.0.5 nomad/event_endpoint.go validateNsOp: read-job for the Allocation topic,
# node read for the Node topic; the same for /v1/allocations and /v1/nodes.

namespace "default" {
  capabilities = ["read-job"]
}

node {
  policy = "read"
}
