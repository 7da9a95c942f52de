# Nomad ACL policy of a CI pipeline that runs `llmgw render --plan` (would the jobs place?).
# It applies catalogs through the admin API (LLMGW_ADMIN_TOKEN), never through Nomad.
# Nomad 2.0.5: /v1/jobs/parse takes parse-job (command/agent/job_endpoint.go,
# JobsParseRequest); Job.Plan takes submit-job or plan-job (nomad/job_endpoint.go, Plan):
# plan-job plans without the right to register anything.

namespace "default" {
  capabilities = ["parse-job", "plan-job"]
}
