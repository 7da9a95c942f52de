# Rendered by llmgw 0.1.0 from templates/sim.nomad.hcl.j2.
# One replica of model "llama-3.1-405b" (profile 1, engine sim).
# Do not edit: change the catalog or the template, then `llmgw render` again.

job "llmgw-llama-3-1-405b-fc727f86-0" {
  name        = "llmgw-llama-3-1-405b-fc727f86-0"
  type        = "service"
  datacenters = ["*"]
  priority    = 50

  # What llmgw needs to adopt this job after its own restart.
  meta = {
    "llmgw_catalog_hash" = "022cd6f14450b6b7573cf9ffe10d6a995372ace5a3c944fb575032f5769811dc"
    "llmgw_engine" = "sim"
    "llmgw_fabric" = "fabric-a"
    "llmgw_managed_by" = "llmgw"
    "llmgw_model" = "llama-3.1-405b"
    "llmgw_profile" = "1"
    "llmgw_replica" = "0"
    "llmgw_spec_hash" = "651d0986614a165f015c2e959d29c06ad8edacee945df54ddaa72112b284049d"
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

  # The ranks of one replica run on distinct nodes of one fabric.
  constraint {
    operator = "distinct_hosts"
    value    = "true"
  }

  constraint {
    attribute = "${meta.llmgw_fabric}"
    value     = "fabric-a"
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
      tags     = ["llmgw", "model=llama-3-1-405b-fc727f86", "replica=llmgw-llama-3-1-405b-fc727f86-0", "rank=0"]

      meta {
        llmgw_engine = "sim"
        llmgw_job = "llmgw-llama-3-1-405b-fc727f86-0"
        llmgw_model = "llama-3.1-405b"
        llmgw_model_slug = "llama-3-1-405b-fc727f86"
        llmgw_profile = "1"
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

    # Rendezvous between the ranks of this replica (never routed to).
    service {
      provider = "consul"
      name     = "llmgw-rank"
      port     = "http"
      tags     = ["llmgw", "replica=llmgw-llama-3-1-405b-fc727f86-0", "rank=0", "head=llmgw-llama-3-1-405b-fc727f86-0"]

      meta {
        llmgw_engine = "sim"
        llmgw_job = "llmgw-llama-3-1-405b-fc727f86-0"
        llmgw_model = "llama-3.1-405b"
        llmgw_model_slug = "llama-3-1-405b-fc727f86"
        llmgw_profile = "1"
        llmgw_rank = "0"
        llmgw_replica = "0"
        llmgw_simulated = "true"
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }

      check {
        name     = "rank reachable"
        type     = "tcp"
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
        args    = ["sim", "--host", "${NOMAD_IP_http}", "--port", "${NOMAD_PORT_http}", "--model", "llama-3.1-405b", "--served-model-name", "llama-3.1-405b", "--rank", "0", "--world-size", "2", "--enable-prompt-tokens-details", "--token-rate", "20.0", "--load-time", "3.0"]
      }

      env = {}

      resources {
        cpu    = 100
        memory = 256

        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }

  group "rank-1" {
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

    # Its templates read Consul (the other ranks): the group's tasks get a Consul
    # workload identity only with a consul block (Nomad >= 1.10); without one their
    # templates read with "invalid-token" (ops/README.md, the GPU nodes).
    consul {}

    # Rendezvous between the ranks of this replica (never routed to).
    service {
      provider = "consul"
      name     = "llmgw-rank"
      port     = "http"
      tags     = ["llmgw", "replica=llmgw-llama-3-1-405b-fc727f86-0", "rank=1", "worker=llmgw-llama-3-1-405b-fc727f86-0"]

      meta {
        llmgw_engine = "sim"
        llmgw_job = "llmgw-llama-3-1-405b-fc727f86-0"
        llmgw_model = "llama-3.1-405b"
        llmgw_model_slug = "llama-3-1-405b-fc727f86"
        llmgw_profile = "1"
        llmgw_rank = "1"
        llmgw_replica = "0"
        llmgw_simulated = "true"
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }

      check {
        name     = "rank reachable"
        type     = "tcp"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "await-head" {
      driver = "raw_exec"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        command = "llmgw"
        args    = ["rendezvous", "wait", "--file", "${NOMAD_TASK_DIR}/llmgw-head", "--lines", "1", "--timeout", "900"]
      }

      # The address of rank 0 of this replica, once it is registered and reachable.
      template {
        destination = "local/llmgw-head"
        data        = "{{ range service \"head=llmgw-llama-3-1-405b-fc727f86-0.llmgw-rank\" }}{{ .Address }}:{{ .Port }}{{ end }}\n"
        change_mode = "noop"
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }

    task "engine" {
      driver       = "raw_exec"
      kill_timeout = "1m"
      kill_signal  = "SIGTERM"

      config {
        command = "llmgw"
        args    = ["sim", "--host", "${NOMAD_IP_http}", "--port", "${NOMAD_PORT_http}", "--head-file", "${NOMAD_TASK_DIR}/llmgw-head", "--model", "llama-3.1-405b", "--served-model-name", "llama-3.1-405b", "--rank", "1", "--world-size", "2", "--enable-prompt-tokens-details", "--token-rate", "20.0", "--load-time", "3.0"]
      }

      env = {}

      # The address of rank 0 of this replica, once it is registered and reachable.
      template {
        destination = "local/llmgw-head"
        data        = "{{ range service \"head=llmgw-llama-3-1-405b-fc727f86-0.llmgw-rank\" }}{{ .Address }}:{{ .Port }}{{ end }}\n"
        change_mode = "noop"
      }

      resources {
        cpu    = 100
        memory = 256

        device "nvidia/gpu" {
          count = 8
        }
      }
    }
  }
}
