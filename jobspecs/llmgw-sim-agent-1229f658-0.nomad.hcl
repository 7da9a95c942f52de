# Rendered by llmgw 0.1.0 from templates/sim.nomad.hcl.j2.
# One replica of model "sim-agent" (profile 0, engine sim).
# Do not edit: change the catalog or the template, then `llmgw render` again.

job "llmgw-sim-agent-1229f658-0" {
  name        = "llmgw-sim-agent-1229f658-0"
  type        = "service"
  datacenters = ["*"]
  priority    = 50

  # What llmgw needs to adopt this job after its own restart.
  meta = {
    "llmgw_catalog_hash" = "022cd6f14450b6b7573cf9ffe10d6a995372ace5a3c944fb575032f5769811dc"
    "llmgw_engine" = "sim"
    "llmgw_managed_by" = "llmgw"
    "llmgw_model" = "sim-agent"
    "llmgw_profile" = "0"
    "llmgw_replica" = "0"
    "llmgw_spec_hash" = "fbd110551d6a9dde8efd35e60f770ae644e2e5df715ccd1272ccd71b29b078cf"
    "llmgw_version" = "0.1.0"
  }

  # llmgw rebuilds a failed replica whole (every shard, freeing every GPU);
  # Nomad must not replace one shard of it on its own.
  reschedule {
    attempts  = 0
    unlimited = false
  }

  # No Nomad deployment: llmgw never updates a job in place (a changed replica is a new
  # job), and under Nomad's default strategy a model loading past the healthy deadline
  # fails its deployment, after which Nomad stops placing groups still waiting for room.
  # max_parallel = 0 is the empty update strategy that creates none.
  update {
    max_parallel = 0
  }

  group "rank-0" {
    count = 1

    # A few local restarts, then the allocation fails and llmgw rebuilds the replica.
    restart {
      attempts = 2
      interval = "5m"
      delay    = "10s"
      mode     = "fail"
    }

    # An unreachable node keeps its allocation (a network blip must not tear
    # down a replica that still serves); lost only after this long.
    disconnect {
      lost_after = "15m"
      replace    = false
    }

    # Deregistered from Consul first, so routers stop sending before the kill.
    shutdown_delay = "10s"

    network {
      port "http" {}
    }

    # The endpoint routers send requests to: one service name for every
    # model, the model in tags and meta, so routers watch them all at once.
    service {
      provider = "consul"
      name     = "llmgw-engine"
      port     = "http"
      tags     = ["llmgw", "model=sim-agent-1229f658", "replica=llmgw-sim-agent-1229f658-0", "rank=0"]

      meta {
        llmgw_engine = "sim"
        llmgw_job = "llmgw-sim-agent-1229f658-0"
        llmgw_model = "sim-agent"
        llmgw_model_slug = "sim-agent-1229f658"
        llmgw_profile = "0"
        llmgw_rank = "0"
        llmgw_replica = "0"
        llmgw_simulated = "true"
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }

      check {
        name     = "engine health"
        type     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "engine" {
      driver       = "raw_exec"
      kill_timeout = "1m"
      kill_signal  = "SIGTERM"

      config {
        command = "llmgw"
        args    = ["sim", "--host", "${NOMAD_IP_http}", "--port", "${NOMAD_PORT_http}", "--model", "sim-agent", "--served-model-name", "sim-agent", "--rank", "0", "--world-size", "1", "--enable-prompt-tokens-details", "--token-rate", "2000.0", "--load-time", "0.5", "--max-model-len", "1000000", "--answer-tokens", "8"]
      }

      env = {}

      resources {
        cpu    = 100
        memory = 256
      }
    }
  }
}
