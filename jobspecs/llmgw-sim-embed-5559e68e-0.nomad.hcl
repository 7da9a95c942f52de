# Rendered by llmgw 0.1.0 from templates/sim.nomad.hcl.j2.
# One replica of model "sim-embed" (profile 0, engine sim).
# Do not edit: change the catalog or the template, then `llmgw render` again.

job "llmgw-sim-embed-5559e68e-0" {
  name        = "llmgw-sim-embed-5559e68e-0"
  type        = "service"
  datacenters = ["*"]
  priority    = 50

  # What llmgw needs to adopt this job after its own restart.
  meta = {
    "llmgw_catalog_hash" = "022cd6f14450b6b7573cf9ffe10d6a995372ace5a3c944fb575032f5769811dc"
    "llmgw_engine" = "sim"
    "llmgw_managed_by" = "llmgw"
    "llmgw_model" = "sim-embed"
    "llmgw_profile" = "0"
    "llmgw_replica" = "0"
    "llmgw_spec_hash" = "199e9c96530efd6764f3c6d62938fe737493634409cbf83a2a1c0202e4827a54"
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
      tags     = ["llmgw", "model=sim-embed-5559e68e", "replica=llmgw-sim-embed-5559e68e-0", "rank=0"]

      meta {
        llmgw_engine = "sim"
        llmgw_job = "llmgw-sim-embed-5559e68e-0"
        llmgw_model = "sim-embed"
        llmgw_model_slug = "sim-embed-5559e68e"
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
        args    = ["sim", "--host", "${NOMAD_IP_http}", "--port", "${NOMAD_PORT_http}", "--model", "sim-embed", "--served-model-name", "sim-embed", "--rank", "0", "--world-size", "1", "--enable-prompt-tokens-details"]
      }

      env = {}

      resources {
        cpu    = 100
        memory = 256
      }
    }
  }
}
