# Consul ACL policy of whoever runs `llmgw status` (an operator, a dashboard).
# The status is stored in pieces under llmgw/status/parts/ (one Consul value holds 512 KiB).

key_prefix "llmgw/status" {
  policy = "read"
}
