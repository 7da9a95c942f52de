# Rendered by llmgw 0.1.0 from templates/llamacpp.nomad.hcl.j2.
# One replica of model "qwen2.5-7b-gguf" (profile 0, engine llamacpp).
# Do not edit: change the catalog or the template, then `llmgw render` again.

job "llmgw-qwen2-5-7b-gguf-6c62c6de-0" {
  name        = "llmgw-qwen2-5-7b-gguf-6c62c6de-0"
  type        = "service"
  datacenters = ["*"]
  priority    = 50

  # What llmgw needs to adopt this job after its own restart.
  meta = {
    "llmgw_catalog_hash" = "022cd6f14450b6b7573cf9ffe10d6a995372ace5a3c944fb575032f5769811dc"
    "llmgw_engine" = "llamacpp"
    "llmgw_managed_by" = "llmgw"
    "llmgw_model" = "qwen2.5-7b-gguf"
    "llmgw_profile" = "0"
    "llmgw_replica" = "0"
    "llmgw_spec_hash" = "5b3769a224283213a13d88b218ba87acafe3b347ef9cc22340f62b6bfd974f0b"
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
      mode = "host"
      port "http" {}
    }

    # The endpoint routers send requests to: one service name for every
    # model, the model in tags and meta, so routers watch them all at once.
    service {
      provider = "consul"
      name     = "llmgw-engine"
      port     = "http"
      tags     = ["llmgw", "model=qwen2-5-7b-gguf-6c62c6de", "replica=llmgw-qwen2-5-7b-gguf-6c62c6de-0", "rank=0"]

      meta {
        llmgw_engine = "llamacpp"
        llmgw_job = "llmgw-qwen2-5-7b-gguf-6c62c6de-0"
        llmgw_model = "qwen2.5-7b-gguf"
        llmgw_model_slug = "qwen2-5-7b-gguf-6c62c6de"
        llmgw_profile = "0"
        llmgw_rank = "0"
        llmgw_replica = "0"
        llmgw_simulated = "false"
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
      driver       = "docker"
      kill_timeout = "1m"
      kill_signal  = "SIGTERM"

      config {
        image        = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434"
        # The whole pull of an engine image of many GB (the plugin's default is 5m).
        image_pull_timeout = "15m"
        entrypoint   = ["/app/llama-server"]
        args         = ["--model", "/local/model.gguf", "--host", "0.0.0.0", "--port", "${NOMAD_PORT_http}", "--alias", "qwen2.5-7b-gguf", "--no-slots", "--ctx-size", "8192", "--n-gpu-layers", "999"]
        network_mode = "host"
      }

      # The GGUF file, downloaded by the Nomad client into the task's local/ dir.
      artifact {
        source      = "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct-GGUF/resolve/main/qwen2.5-7b-instruct-q4_k_m.gguf"
        destination = "local/model.gguf"
        mode        = "file"

        # A file, never an archive to unpack.
        options {
          archive = "false"
        }
      }

      env = {}

      # GPUs reach a container through the NVIDIA runtime registered with Docker.
      constraint {
        attribute = "${attr.driver.docker.runtimes}"
        operator  = "set_contains"
        value     = "nvidia"
      }

      resources {
        cpu    = 2000
        memory = 16384

        device "nvidia/gpu" {
          count = 2
        }
      }
    }
  }
}
