# Rendered by llmgw 0.1.0 from templates/sglang.nomad.hcl.j2.
# One replica of model "llama-3.1-405b" (profile 0, engine sglang).
# Do not edit: change the catalog or the template, then `llmgw render` again.

job "llmgw-llama-3-1-405b-fc727f86-0" {
  name        = "llmgw-llama-3-1-405b-fc727f86-0"
  type        = "service"
  datacenters = ["*"]
  priority    = 50

  # What llmgw needs to adopt this job after its own restart.
  meta = {
    "llmgw_catalog_hash" = "022cd6f14450b6b7573cf9ffe10d6a995372ace5a3c944fb575032f5769811dc"
    "llmgw_engine" = "sglang"
    "llmgw_fabric" = "fabric-a"
    "llmgw_managed_by" = "llmgw"
    "llmgw_model" = "llama-3.1-405b"
    "llmgw_profile" = "0"
    "llmgw_replica" = "0"
    "llmgw_spec_hash" = "d7dc08a8022326df2b7dba339e9b2c7fda3b89c26ccdd942c49d1882d84e402c"
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
      mode = "host"
      port "http" {}
      port "dist" {}
    }

    # The endpoint routers send requests to: one service name for every
    # model, the model in tags and meta, so routers watch them all at once.
    service {
      provider = "consul"
      name     = "llmgw-engine"
      port     = "http"
      tags     = ["llmgw", "model=llama-3-1-405b-fc727f86", "replica=llmgw-llama-3-1-405b-fc727f86-0", "rank=0"]

      meta {
        llmgw_engine = "sglang"
        llmgw_job = "llmgw-llama-3-1-405b-fc727f86-0"
        llmgw_model = "llama-3.1-405b"
        llmgw_model_slug = "llama-3-1-405b-fc727f86"
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
        timeout  = "22s"
      }
    }

    # Rendezvous between the ranks of this replica (never routed to).
    service {
      provider = "consul"
      name     = "llmgw-rank"
      port     = "dist"
      tags     = ["llmgw", "replica=llmgw-llama-3-1-405b-fc727f86-0", "rank=0", "head=llmgw-llama-3-1-405b-fc727f86-0"]

      meta {
        llmgw_engine = "sglang"
        llmgw_job = "llmgw-llama-3-1-405b-fc727f86-0"
        llmgw_model = "llama-3.1-405b"
        llmgw_model_slug = "llama-3-1-405b-fc727f86"
        llmgw_profile = "0"
        llmgw_rank = "0"
        llmgw_replica = "0"
        llmgw_simulated = "false"
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }

      check {
        name     = "rank reachable"
        type     = "tcp"
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
        image        = "lmsysorg/sglang:v0.5.23-cu130"
        # The whole pull of an engine image of many GB (the plugin's default is 5m).
        image_pull_timeout = "15m"
        entrypoint   = ["python3"]
        args         = ["-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-405B-Instruct-FP8", "--served-model-name", "llama-3.1-405b", "--tp-size", "16", "--pp-size", "1", "--tool-call-parser", "llama3", "--enable-cache-report", "--host", "0.0.0.0", "--port", "${NOMAD_PORT_http}", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "${NOMAD_ADDR_dist}", "--dist-timeout", "3600"]
        network_mode = "host"
        # Shared memory for NCCL and the engine's workers, in the container's own IPC
        # namespace: no host IPC, which a default docker plugin refuses.
        shm_size     = 34359738368
      }

      env = {
        "HF_HUB_CACHE" = "/llmgw-cache/hub"
        "NCCL_IB_DISABLE" = "0"
        "NCCL_SOCKET_IFNAME" = "eth0"
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
        cpu    = 32000
        memory = 262144

        device "nvidia/gpu" {
          count = 8

          # The device plugin names a card as NVML does ("NVIDIA H100 80GB HBM3"):
          # the catalog's model is matched as a whole word in it, any case.
          constraint {
            attribute = "${device.model}"
            operator  = "regexp"
            value     = "(?i)(^|[^a-z0-9])H100([^a-z0-9]|$)"
          }

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "76293 MiB"
          }
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
      mode = "host"
      port "health" {}
    }

    # Its templates read Consul (the other ranks): the group's tasks get a Consul
    # workload identity only with a consul block (Nomad >= 1.10); without one their
    # templates read with "invalid-token" (ops/README.md, the GPU nodes).
    consul {}

    # Rendezvous between the ranks of this replica (never routed to).
    service {
      provider = "consul"
      name     = "llmgw-rank"
      tags     = ["llmgw", "replica=llmgw-llama-3-1-405b-fc727f86-0", "rank=1", "worker=llmgw-llama-3-1-405b-fc727f86-0"]

      meta {
        llmgw_engine = "sglang"
        llmgw_job = "llmgw-llama-3-1-405b-fc727f86-0"
        llmgw_model = "llama-3.1-405b"
        llmgw_model_slug = "llama-3-1-405b-fc727f86"
        llmgw_profile = "0"
        llmgw_rank = "1"
        llmgw_replica = "0"
        llmgw_simulated = "false"
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }
    }

    # The node's model cache (the client's host_volume "llmgw-models").
    volume "model-cache" {
      type      = "host"
      source    = "llmgw-models"
      read_only = false
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
      driver       = "docker"
      kill_timeout = "1m"
      kill_signal  = "SIGTERM"

      config {
        image        = "lmsysorg/sglang:v0.5.23-cu130"
        # The whole pull of an engine image of many GB (the plugin's default is 5m).
        image_pull_timeout = "15m"
        entrypoint   = ["python3"]
        args         = ["-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-405B-Instruct-FP8", "--served-model-name", "llama-3.1-405b", "--tp-size", "16", "--pp-size", "1", "--tool-call-parser", "llama3", "--enable-cache-report", "--host", "127.0.0.1", "--port", "${NOMAD_PORT_health}", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "${LLMGW_HEAD_ADDR}", "--dist-timeout", "3600"]
        network_mode = "host"
        # Shared memory for NCCL and the engine's workers, in the container's own IPC
        # namespace: no host IPC, which a default docker plugin refuses.
        shm_size     = 34359738368
      }

      env = {
        "HF_HUB_CACHE" = "/llmgw-cache/hub"
        "NCCL_IB_DISABLE" = "0"
        "NCCL_SOCKET_IFNAME" = "eth0"
      }

      # Where the engine's Hub downloads land (HF_HUB_CACHE in env).
      volume_mount {
        volume      = "model-cache"
        destination = "/llmgw-cache"
        read_only   = false
      }

      # The address of rank 0 of this replica, once it is registered and reachable.
      template {
        destination = "secrets/llmgw-head.env"
        data        = "LLMGW_HEAD_ADDR={{ range service \"head=llmgw-llama-3-1-405b-fc727f86-0.llmgw-rank\" }}{{ .Address }}:{{ .Port }}{{ end }}\nLLMGW_HEAD_IP={{ range service \"head=llmgw-llama-3-1-405b-fc727f86-0.llmgw-rank\" }}{{ .Address }}{{ end }}\nLLMGW_HEAD_PORT={{ range service \"head=llmgw-llama-3-1-405b-fc727f86-0.llmgw-rank\" }}{{ .Port }}{{ end }}\n"
        change_mode = "noop"
        env         = true
      }

      # GPUs reach a container through the NVIDIA runtime registered with Docker.
      constraint {
        attribute = "${attr.driver.docker.runtimes}"
        operator  = "set_contains"
        value     = "nvidia"
      }

      resources {
        cpu    = 32000
        memory = 262144

        device "nvidia/gpu" {
          count = 8

          # The device plugin names a card as NVML does ("NVIDIA H100 80GB HBM3"):
          # the catalog's model is matched as a whole word in it, any case.
          constraint {
            attribute = "${device.model}"
            operator  = "regexp"
            value     = "(?i)(^|[^a-z0-9])H100([^a-z0-9]|$)"
          }

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "76293 MiB"
          }
        }
      }
    }
  }
}
