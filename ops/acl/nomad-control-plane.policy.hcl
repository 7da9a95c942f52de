# Nomad ACL policy of llmgw's control plane (its NOMAD_TOKEN).
# Nomad 2.0.5: acl/policy.go (the capabilities), nomad/job_endpoint.go (which each call checks).

# The namespace llmgw submits to (NOMAD_NAMESPACE; "default" without it).
namespace "default" {
  # list-jobs: adopt llmgw's jobs at start; read-job: a job, its allocations, evaluations
  # and the Job, Allocation and Evaluation event topics; submit-job: register, plan and
  # deregister (Job.Register checks it before the volumes), and the renderer's check
  # through /v1/jobs/parse, which takes parse-job or submit-job
  # (command/agent/job_endpoint.go, JobsParseRequest), so parse-job is not needed here.
  capabilities = ["list-jobs", "read-job", "submit-job"]

  # Engine keys (LLMGW_ENGINE_KEY_SECRET): each replica's Variable nomad/jobs/<job id>,
  # written before its job is registered and destroyed after it stops.
  variables {
    path "nomad/jobs/llmgw-*" {
      capabilities = ["write", "destroy"]
    }
  }
}

# vLLM and SGLang replicas mount the model cache read-write (LLMGW_MODEL_CACHE_VOLUME,
# llmgw-models by default): Job.Register ("Validate Volume Permissions") refuses a job
# with a read-write host volume unless the token has mount-readwrite on its source.
# Job.Plan does not check it, so without this rule every such replica plans and then
# gets 403 on register. Name your volume here if you changed the setting.
host_volume "llmgw-models" {
  capabilities = ["mount-readwrite"]
}

# Placement needs the nodes, their devices and the Node event topic.
node {
  policy = "read"
}
