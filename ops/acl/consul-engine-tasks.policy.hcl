# Consul ACL policy of the engines' tasks (the role nomad-default-tasks, which the binding
# rule gives every task with a Consul workload identity in Nomad's namespace "default").
# The rendezvous templates of a multi-node replica read the health of llmgw-rank to find
# the replica's head and its other ranks. Health answers are filtered by node and service
# (agent/consul/acl.go, filterCheckServiceNodes): without node read they are empty.

service "llmgw-rank" {
  policy = "read"
}

node_prefix "" {
  policy = "read"
}
