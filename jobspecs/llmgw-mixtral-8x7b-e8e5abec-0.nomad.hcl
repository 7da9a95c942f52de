# Rendered by llmgw 0.1.0 from templates/vllm.nomad.hcl.j2.
# One replica of model "mixtral-8x7b" (profile 0, engine vllm).
# Do not edit: change the catalog or the template, then `llmgw render` again.

job "llmgw-mixtral-8x7b-e8e5abec-0" {
  name        = "llmgw-mixtral-8x7b-e8e5abec-0"
  type        = "service"
  datacenters = ["*"]
  priority    = 50

  # What llmgw needs to adopt this job after its own restart.
  meta = {
    "llmgw_catalog_hash" = "022cd6f14450b6b7573cf9ffe10d6a995372ace5a3c944fb575032f5769811dc"
    "llmgw_engine" = "vllm"
    "llmgw_managed_by" = "llmgw"
    "llmgw_model" = "mixtral-8x7b"
    "llmgw_profile" = "0"
    "llmgw_replica" = "0"
    "llmgw_spec_hash" = "24093400d1e20311127609973636b0bba89a1a93d37f469ce48ff16ef5b43d94"
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
      tags     = ["llmgw", "model=mixtral-8x7b-e8e5abec", "replica=llmgw-mixtral-8x7b-e8e5abec-0", "rank=0"]

      meta {
        llmgw_engine = "vllm"
        llmgw_job = "llmgw-mixtral-8x7b-e8e5abec-0"
        llmgw_model = "mixtral-8x7b"
        llmgw_model_slug = "mixtral-8x7b-e8e5abec"
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

    # The node's model cache (the client's host_volume "llmgw-models").
    volume "model-cache" {
      type      = "host"
      source    = "llmgw-models"
      read_only = false
    }

    task "engine" {
      driver       = "docker"
      kill_timeout = "1m"
      kill_signal  = "SIGTERM"

      config {
        image        = "vllm/vllm-openai:v0.11.0"
        # The whole pull of an engine image of many GB (the plugin's default is 5m).
        image_pull_timeout = "15m"
        entrypoint   = ["vllm"]
        args         = ["serve", "mistralai/Mixtral-8x7B-Instruct-v0.1", "--host", "0.0.0.0", "--port", "${NOMAD_PORT_http}", "--served-model-name", "mixtral-8x7b", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--enable-auto-tool-choice", "--tool-call-parser", "mistral", "--enable-prompt-tokens-details"]
        network_mode = "host"
        # Shared memory for NCCL and the engine's workers, in the container's own IPC
        # namespace: no host IPC, which a default docker plugin refuses.
        shm_size     = 10737418240
      }

      env = {
        "HF_HUB_CACHE" = "/llmgw-cache/hub"
        "VLLM_MEDIA_URL_ALLOW_REDIRECTS" = "0"
      }

      # Where the engine's Hub downloads land (HF_HUB_CACHE in env).
      volume_mount {
        volume      = "model-cache"
        destination = "/llmgw-cache"
        read_only   = false
      }

      # GPUs reach a container through the NVIDIA runtime registered with Docker.
      constraint {
        attribute = "${attr.driver.docker.runtimes}"
        operator  = "set_contains"
        value     = "nvidia"
      }

      resources {
        cpu    = 4000
        memory = 32768

        device "nvidia/gpu" {
          count = 4
        }
      }
    }
  }
}
