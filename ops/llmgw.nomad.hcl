# llmgw itself on the cluster it manages: two control planes (one leads through a
# Consul lock; each has its admin API on the host's loopback) and three routers.
# llmgw is installed on these hosts in a venv under /usr/local (the exec driver's
# chroot has /usr, not /opt):
#   python3.11 -m venv /usr/local/lib/llmgw
#   /usr/local/lib/llmgw/bin/pip install --require-hashes -r requirements.lock
#   /usr/local/lib/llmgw/bin/pip install --no-deps .
# Secrets come from the Nomad variable nomad/jobs/llmgw (nomad var put ...).

job "llmgw" {
  type        = "service"
  datacenters = ["dc1"]

  group "control-plane" {
    count = 2

    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    update {
      max_parallel     = 1
      min_healthy_time = "30s"
    }

    # The control plane's /metrics and /health, for Prometheus (ops/prometheus/prometheus.yml
    # finds it through this service). Every instance serves them, leader or standby.
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
        command = "/usr/local/lib/llmgw/bin/llmgw"
        args    = ["serve", "--role", "control-plane", "--admin-host", "127.0.0.1", "--admin-port", "8081",
                   "--control-metrics-host", "0.0.0.0", "--control-metrics-port", "${NOMAD_PORT_metrics}"]
      }

      # Where Nomad and Consul are, and who llmgw is to them (see the ACL policies).
      template {
        destination = "secrets/llmgw.env"
        env         = true
        data        = <<-EOT
          NOMAD_ADDR=https://nomad.service.consul:4646
          NOMAD_CACERT=/usr/local/share/ca-certificates/nomad-ca.crt
          CONSUL_HTTP_ADDR=127.0.0.1:8500
          {{ with nomadVar "nomad/jobs/llmgw" }}
          NOMAD_TOKEN={{ .control_nomad_token }}
          CONSUL_HTTP_TOKEN={{ .control_consul_token }}
          LLMGW_ADMIN_TOKEN={{ .admin_token }}
          {{ end }}
        EOT
      }

      env {
        LLMGW_DATACENTERS = "dc1"
        LLMGW_MIRROR_URL  = "http://mirror.service.consul:8900"
        LLMGW_LOG_LEVEL   = "INFO"
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
    count = 3

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
        static = 8080
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
        command = "/usr/local/lib/llmgw/bin/llmgw"
        args    = ["serve", "--role", "router", "--host", "0.0.0.0", "--port", "${NOMAD_PORT_http}", "--router-id", "${node.unique.name}"]
      }

      template {
        destination = "secrets/llmgw.env"
        env         = true
        data        = <<-EOT
          NOMAD_ADDR=https://nomad.service.consul:4646
          NOMAD_CACERT=/usr/local/share/ca-certificates/nomad-ca.crt
          CONSUL_HTTP_ADDR=127.0.0.1:8500
          {{ with nomadVar "nomad/jobs/llmgw" }}
          NOMAD_TOKEN={{ .router_nomad_token }}
          CONSUL_HTTP_TOKEN={{ .router_consul_token }}
          {{ end }}
        EOT
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
    count = 1

    volume "store" {
      type      = "host"
      source    = "llmgw-mirror"
      read_only = true
    }

    network {
      port "http" {
        static = 8900
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
        command = "/usr/local/lib/llmgw/bin/llmgw"
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
