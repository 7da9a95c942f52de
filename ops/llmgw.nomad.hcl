# llmgw itself on the cluster it manages: control planes (one leads through a Consul
# lock; each has its admin API on its host's loopback), routers behind the load balancer,
# and the model mirror. ops/DEPLOY.md is the whole procedure; this file runs as given
# once its variables are set (nomad job run -var ... or -var-file; a variable without a
# default must be set). llmgw is installed on these hosts in a venv under /usr/local
# (the exec driver's chroot has /usr, not /opt):
#   python3.11 -m venv /usr/local/lib/llmgw
#   /usr/local/lib/llmgw/bin/pip install --require-hashes -r requirements.lock
#   /usr/local/lib/llmgw/bin/pip install --no-deps .
# Secrets come from the job's own Nomad Variable nomad/jobs/llmgw, which its tasks read
# with their workload identity and no policy (DEPLOY.md, step 2): control_nomad_token,
# control_consul_token, router_nomad_token, router_consul_token, admin_token,
# engine_key_secret.

variable "datacenters" {
  description = "The Nomad datacenters llmgw itself runs in (the job's datacenters)."
  type        = list(string)
}

variable "replica_datacenters" {
  description = "The datacenters of the GPU nodes llmgw places replicas in (LLMGW_DATACENTERS), comma-separated; * for any."
  type        = string
  default     = "*"
}

variable "nomad_addr" {
  description = "Nomad's HTTP API as the control planes and routers reach it (NOMAD_ADDR)."
  type        = string
  default     = "https://nomad.service.consul:4646"
}

variable "nomad_cacert" {
  description = "The CA file of Nomad's HTTPS certificate on the hosts (NOMAD_CACERT); empty for none."
  type        = string
  default     = "/usr/local/share/ca-certificates/nomad-ca.crt"
}

variable "consul_addr" {
  description = "Consul's HTTP API (CONSUL_HTTP_ADDR): the host's own Consul agent."
  type        = string
  default     = "127.0.0.1:8500"
}

variable "consul_cacert" {
  description = "The CA file of Consul's HTTPS certificate (CONSUL_CACERT); empty for none (plain HTTP to the local agent)."
  type        = string
  default     = ""
}

variable "llmgw_command" {
  description = "llmgw on every host, GPU nodes included (LLMGW_NODE_COMMAND)."
  type        = string
  default     = "/usr/local/lib/llmgw/bin/llmgw"
}

variable "hf_token_variable" {
  description = "The Nomad Variable engines read HF_TOKEN from (LLMGW_HF_TOKEN_VARIABLE); empty for none."
  type        = string
  default     = ""
}

variable "mirror_url" {
  description = "The model mirror the GPU nodes fetch from (LLMGW_MIRROR_URL)."
  type        = string
  default     = "http://mirror.service.consul:8900"
}

variable "control_plane_count" {
  type    = number
  default = 2
}

variable "router_count" {
  type    = number
  default = 3
}

variable "mirror_count" {
  description = "1 runs the model mirror (optional); its service needs service \"mirror\" write in ops/acl/consul-nomad-agent.policy.hcl."
  type        = number
  default     = 0
}

variable "router_port" {
  description = "The routers' static port, which the load balancer sends to."
  type        = number
  default     = 8080
}

variable "admin_port" {
  description = "The admin API's port on each control plane's loopback (llmgw ctl --admin-url)."
  type        = number
  default     = 8081
}

variable "mirror_port" {
  type    = number
  default = 8900
}

job "llmgw" {
  type        = "service"
  datacenters = var.datacenters

  group "control-plane" {
    count = var.control_plane_count

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    update {
      max_parallel     = 1
      min_healthy_time = "30s"
      health_check     = "checks"
    }

    # The control plane's /metrics and /health: Nomad's deployment health and Consul's
    # check of each instance (200 for leader and standby alike, {"leader": ...}), and
    # Prometheus's target (ops/prometheus/prometheus.yml finds it through this service).
    network {
      port "metrics" {}
    }

    service {
      provider = "consul"
      name     = "llmgw-control-metrics"
      port     = "metrics"
      tags     = ["llmgw"]
      meta {
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }

      check {
        type     = "http"
        path     = "/health"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "serve" {
      driver = "exec"

      config {
        command = var.llmgw_command
        args    = ["serve", "--role", "control-plane", "--admin-host", "127.0.0.1", "--admin-port", format("%d", var.admin_port),
                   "--control-metrics-host", "0.0.0.0", "--control-metrics-port", "${NOMAD_PORT_metrics}"]
      }

      # Who the control plane is to Nomad and Consul (ops/acl/*control-plane*), the admin
      # API's token and the engines' key secret: from the job's Variable, into the task's
      # environment only (secrets/ is the task's own; no argv, no job text holds them).
      template {
        destination = "secrets/llmgw.env"
        env         = true
        data        = <<-EOT
          {{ with nomadVar "nomad/jobs/llmgw" }}
          NOMAD_TOKEN={{ .control_nomad_token }}
          CONSUL_HTTP_TOKEN={{ .control_consul_token }}
          LLMGW_ADMIN_TOKEN={{ .admin_token }}
          LLMGW_ENGINE_KEY_SECRET={{ .engine_key_secret }}
          {{ end }}
        EOT
      }

      env {
        NOMAD_ADDR              = var.nomad_addr
        NOMAD_CACERT            = var.nomad_cacert
        CONSUL_HTTP_ADDR        = var.consul_addr
        CONSUL_CACERT           = var.consul_cacert
        LLMGW_DATACENTERS       = var.replica_datacenters
        LLMGW_NODE_COMMAND      = var.llmgw_command
        LLMGW_HF_TOKEN_VARIABLE = var.hf_token_variable
        LLMGW_MIRROR_URL        = var.mirror_url
        LLMGW_LOG_LEVEL         = "INFO"
      }

      # SIGTERM: the leader resigns at once, so a standby takes over without
      # waiting out the lock delay.
      kill_timeout = "15s"

      resources {
        cpu    = 1000
        memory = 1024
      }
    }
  }

  group "router" {
    count = var.router_count

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    update {
      max_parallel     = 1
      min_healthy_time = "10s"
      health_check     = "checks"
    }

    network {
      port "http" {
        static = var.router_port
      }
    }

    # Out of the load balancer's pool (Consul) before SIGTERM; then in-flight
    # requests get the router's --shutdown-timeout (30 s) to finish.
    shutdown_delay = "5s"

    service {
      provider = "consul"
      name     = "llmgw-router"
      port     = "http"
      tags     = ["llmgw"]
      meta {
        nomad_alloc_id = "${NOMAD_ALLOC_ID}"
      }

      check {
        type     = "http"
        path     = "/health"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "serve" {
      driver = "exec"

      config {
        command = var.llmgw_command
        args    = ["serve", "--role", "router", "--host", "0.0.0.0", "--port", "${NOMAD_PORT_http}", "--router-id", "${node.unique.name}"]
      }

      # The router's own tokens (ops/acl/*router*) and the engines' key secret, which it
      # derives each replica's key from (the same value as the control plane's).
      template {
        destination = "secrets/llmgw.env"
        env         = true
        data        = <<-EOT
          {{ with nomadVar "nomad/jobs/llmgw" }}
          NOMAD_TOKEN={{ .router_nomad_token }}
          CONSUL_HTTP_TOKEN={{ .router_consul_token }}
          LLMGW_ENGINE_KEY_SECRET={{ .engine_key_secret }}
          {{ end }}
        EOT
      }

      env {
        NOMAD_ADDR       = var.nomad_addr
        NOMAD_CACERT     = var.nomad_cacert
        CONSUL_HTTP_ADDR = var.consul_addr
        CONSUL_CACERT    = var.consul_cacert
        LLMGW_LOG_LEVEL  = "INFO"
      }

      kill_timeout = "35s"

      resources {
        cpu    = 2000
        memory = 1024
      }
    }
  }

  # The model mirror the GPU nodes fetch weights from (LLMGW_MIRROR_URL above).
  # The store is a host volume on one machine; `llmgw mirror add --store ...`
  # fills it from that machine. Plain HTTP without authentication: keep it on
  # the nodes' network.
  group "mirror" {
    count = var.mirror_count

    volume "store" {
      type      = "host"
      source    = "llmgw-mirror"
      read_only = true
    }

    network {
      port "http" {
        static = var.mirror_port
      }
    }

    service {
      provider = "consul"
      name     = "mirror"
      port     = "http"

      check {
        type     = "http"
        path     = "/healthz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "serve" {
      driver = "exec"

      config {
        command = var.llmgw_command
        args    = ["mirror", "serve", "--store", "/srv/llmgw-mirror", "--host", "0.0.0.0", "--port", "${NOMAD_PORT_http}"]
      }

      volume_mount {
        volume      = "store"
        destination = "/srv/llmgw-mirror"
        read_only   = true
      }

      resources {
        cpu    = 1000
        memory = 512
      }
    }
  }
}
