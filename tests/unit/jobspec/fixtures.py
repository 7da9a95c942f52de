"""Jobspec fixtures and the api.Job JSON jobspec2 returns for them, written from Nomad's behaviour.

Each expected document was written by hand from jobspec2's rules (labels become
Name/ID, durations are nanoseconds, ports with ``static`` move to ReservedPorts,
templates get ChangeMode/Perms/Splay/ErrMissingKey, constraint shorthands set
Operand, unknown ``${...}`` references stay as text), not produced by the parser.
"""

from __future__ import annotations

S = 1_000_000_000  # nanoseconds in a second

ENGINE = r"""
job "llm-qwen" {
  datacenters = ["dc1", "dc2"]
  type        = "service"
  priority    = 70
  node_pool   = "gpu"

  meta {
    llmgw_model = "qwen2.5-7b"
    llmgw_spec  = "a1b2c3"
  }

  update {
    max_parallel      = 1
    min_healthy_time  = "30s"
    healthy_deadline  = "10m"
    progress_deadline = "15m"
    auto_revert       = true
    canary            = 0
  }

  group "engine" {
    count = 2

    network {
      mode = "host"
      port "http" {}
      port "metrics" {
        static = 9100
      }
    }

    restart {
      attempts = 3
      interval = "30m"
      delay    = "15s"
      mode     = "fail"
    }

    reschedule {
      delay          = "30s"
      delay_function = "exponential"
      max_delay      = "1h"
      unlimited      = true
    }

    disconnect {
      lost_after = "5m"
      replace    = false
      reconcile  = "keep_original"
    }

    ephemeral_disk {
      size = 2048
    }

    volume "models" {
      type      = "host"
      source    = "models"
      read_only = true
    }

    service {
      name     = "llmgw-engine"
      port     = "http"
      provider = "consul"
      tags     = ["model=qwen2.5-7b", "engine=vllm"]

      meta {
        alloc = "${NOMAD_ALLOC_ID}"
      }

      check {
        type     = "http"
        path     = "/health"
        interval = "10s"
        timeout  = "2s"

        header {
          Authorization = ["Bearer ${NOMAD_META_token}"]
        }

        check_restart {
          limit = 3
          grace = "90s"
        }
      }
    }

    task "vllm" {
      driver         = "docker"
      kill_timeout   = "45s"
      kill_signal    = "SIGTERM"
      shutdown_delay = "5s"

      config {
        image = "vllm/vllm-openai:v0.6.3"
        args  = ["--model", "/models/qwen", "--port", "${NOMAD_PORT_http}", "--tensor-parallel-size", 2]
        ports = ["http"]
        ipc_mode = "host"
        mount {
          type   = "bind"
          source = "/srv/models"
          target = "/models"
        }
        labels = {
          "llmgw.model" = "qwen2.5-7b"
        }
      }

      env {
        HF_HOME     = "/models/hf"
        NODE        = "${attr.unique.hostname}"
        DC          = "${node.datacenter}"
        FABRIC      = "${meta.llmgw_fabric}"
        GPU_MODEL   = "${device.model}"
        HOME_DIR    = "${env["HOME"]}"
      }

      resources {
        cpu    = 4000
        memory = 32768

        device "nvidia/gpu" {
          count = 2

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "40 GiB"
          }
        }
      }

      volume_mount {
        volume      = "models"
        destination = "/models"
        read_only   = true
      }

      logs {
        max_files     = 5
        max_file_size = 20
      }
    }
  }
}
"""

ENGINE_JSON: dict[str, object] = {
    "ID": "llm-qwen",
    "Name": "llm-qwen",
    "Datacenters": ["dc1", "dc2"],
    "Type": "service",
    "Priority": 70,
    "NodePool": "gpu",
    "Meta": {"llmgw_model": "qwen2.5-7b", "llmgw_spec": "a1b2c3"},
    "Update": {
        "MaxParallel": 1,
        "MinHealthyTime": 30 * S,
        "HealthyDeadline": 600 * S,
        "ProgressDeadline": 900 * S,
        "AutoRevert": True,
        "Canary": 0,
    },
    "TaskGroups": [
        {
            "Name": "engine",
            "Count": 2,
            "Networks": [
                {
                    "Mode": "host",
                    "DynamicPorts": [{"Label": "http"}],
                    "ReservedPorts": [{"Label": "metrics", "Value": 9100}],
                }
            ],
            "RestartPolicy": {"Attempts": 3, "Interval": 1800 * S, "Delay": 15 * S, "Mode": "fail"},
            "ReschedulePolicy": {
                "Delay": 30 * S,
                "DelayFunction": "exponential",
                "MaxDelay": 3600 * S,
                "Unlimited": True,
            },
            "Disconnect": {"LostAfter": 300 * S, "Replace": False, "Reconcile": "keep_original"},
            "EphemeralDisk": {"SizeMB": 2048},
            "Volumes": {"models": {"Name": "models", "Type": "host", "Source": "models", "ReadOnly": True}},
            "Services": [
                {
                    "Name": "llmgw-engine",
                    "PortLabel": "http",
                    "Provider": "consul",
                    "Tags": ["model=qwen2.5-7b", "engine=vllm"],
                    "Meta": {"alloc": "${NOMAD_ALLOC_ID}"},
                    "Checks": [
                        {
                            "Type": "http",
                            "Path": "/health",
                            "Interval": 10 * S,
                            "Timeout": 2 * S,
                            "Header": {"Authorization": ["Bearer ${NOMAD_META_token}"]},
                            "CheckRestart": {"Limit": 3, "Grace": 90 * S},
                        }
                    ],
                }
            ],
            "Tasks": [
                {
                    "Name": "vllm",
                    "Driver": "docker",
                    "KillTimeout": 45 * S,
                    "KillSignal": "SIGTERM",
                    "ShutdownDelay": 5 * S,
                    "Config": {
                        "image": "vllm/vllm-openai:v0.6.3",
                        "args": [
                            "--model",
                            "/models/qwen",
                            "--port",
                            "${NOMAD_PORT_http}",
                            "--tensor-parallel-size",
                            2,
                        ],
                        "ports": ["http"],
                        "ipc_mode": "host",
                        # BlocksAsAttrs: a nested block is a list of objects,
                        "mount": [{"type": "bind", "source": "/srv/models", "target": "/models"}],
                        # and an object-constructor attribute is wrapped in a one-element list.
                        "labels": [{"llmgw.model": "qwen2.5-7b"}],
                    },
                    "Env": {
                        "HF_HOME": "/models/hf",
                        "NODE": "${attr.unique.hostname}",
                        "DC": "${node.datacenter}",
                        "FABRIC": "${meta.llmgw_fabric}",
                        "GPU_MODEL": "${device.model}",
                        "HOME_DIR": '${env["HOME"]}',
                    },
                    "Resources": {
                        "CPU": 4000,
                        "MemoryMB": 32768,
                        "Devices": [
                            {
                                "Name": "nvidia/gpu",
                                "Count": 2,
                                "Constraints": [
                                    {"LTarget": "${device.attr.memory}", "RTarget": "40 GiB", "Operand": ">="}
                                ],
                            }
                        ],
                    },
                    "VolumeMounts": [{"Volume": "models", "Destination": "/models", "ReadOnly": True}],
                    "LogConfig": {"MaxFiles": 5, "MaxFileSizeMB": 20},
                }
            ],
        }
    ],
}

PRESTART = r"""
variable "model" {
  type    = string
  default = "qwen2.5-7b"
}

variable "replicas" {
  type    = number
  default = 1
}

variables {
  registry = "ghcr.io/acme"
}

locals {
  image = "${var.registry}/llmgw-sim:1.0"
  port_names = ["http", "metrics"]
}

job "llm" {
  name = "llm-${var.model}"

  group "engine" {
    count = var.replicas

    task "fetch-weights" {
      driver = "raw_exec"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        command = "/usr/local/bin/llmgw"
        args    = ["mirror", "fetch", var.model]
      }

      env = {
        "LLMGW_CACHE.DIR" = "/var/cache/llmgw"
        MODEL             = upper(var.model)
      }
    }

    task "engine" {
      driver = "docker"

      config {
        image = local.image
        ports = local.port_names
      }

      template {
        destination = "local/upstreams.conf"
        change_mode = "signal"
        change_signal = "SIGHUP"
        data        = <<-EOT
          {{ range service "llmgw-engine" }}
          server {{ .Address }}:{{ .Port }};
          {{ end }}
          model = ${var.model}
          literal = $${not_hcl}
        EOT
      }

      template {
        destination = "secrets/env"
        env         = true
        data        = <<EOF
LLMGW_MODEL={{ key "llmgw/models/${var.model}" }}
EOF
      }
    }
  }
}
"""

PRESTART_JSON: dict[str, object] = {
    "ID": "llm",
    "Name": "llm-qwen2.5-7b",
    "TaskGroups": [
        {
            "Name": "engine",
            "Count": 1,
            "Tasks": [
                {
                    "Name": "fetch-weights",
                    "Driver": "raw_exec",
                    "Lifecycle": {"Hook": "prestart", "Sidecar": False},
                    "Config": {"command": "/usr/local/bin/llmgw", "args": ["mirror", "fetch", "qwen2.5-7b"]},
                    "Env": {"LLMGW_CACHE.DIR": "/var/cache/llmgw", "MODEL": "QWEN2.5-7B"},
                },
                {
                    "Name": "engine",
                    "Driver": "docker",
                    "Config": {"image": "ghcr.io/acme/llmgw-sim:1.0", "ports": ["http", "metrics"]},
                    "Templates": [
                        {
                            "DestPath": "local/upstreams.conf",
                            "ChangeMode": "signal",
                            "ChangeSignal": "SIGHUP",
                            "EmbeddedTmpl": (
                                '{{ range service "llmgw-engine" }}\n'
                                "server {{ .Address }}:{{ .Port }};\n"
                                "{{ end }}\n"
                                "model = qwen2.5-7b\n"
                                "literal = ${not_hcl}\n"
                            ),
                            "Perms": "0644",
                            "Splay": 5 * S,
                            "ErrMissingKey": False,
                        },
                        {
                            "DestPath": "secrets/env",
                            "Envvars": True,
                            "EmbeddedTmpl": 'LLMGW_MODEL={{ key "llmgw/models/qwen2.5-7b" }}\n',
                            "ChangeMode": "restart",
                            "Perms": "0644",
                            "Splay": 5 * S,
                            "ErrMissingKey": False,
                        },
                    ],
                },
            ],
        }
    ],
}

PLACEMENT = r"""
job "batch-eval" {
  type = "batch"

  constraint {
    distinct_hosts = true
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    attribute = "${attr.nvidia.driver.version}"
    version   = ">= 535.0"
  }

  constraint {
    attribute = "${node.class}"
    regexp    = "^gpu-"
  }

  constraint {
    distinct_property = "${meta.rack}"
    value             = 2
  }

  constraint {
    attribute    = "${meta.llmgw_features}"
    set_contains = "nvlink,ib"
  }

  affinity {
    attribute = "${meta.llmgw_fabric}"
    value     = "ib"
    weight    = 50
  }

  spread {
    attribute = "${node.datacenter}"
    weight    = 100

    target "dc1" {
      percent = 70
    }
    target "dc2" {
      percent = 30
    }
  }

  periodic {
    crons            = ["0 3 * * *"]
    prohibit_overlap = true
    time_zone        = "UTC"
  }

  parameterized {
    payload       = "optional"
    meta_required = ["model"]
  }

  vault {
    policies = ["llmgw-read"]
  }

  migrate {
    max_parallel     = 1
    health_check     = "checks"
    min_healthy_time = "10s"
    healthy_deadline = "5m"
  }

  task "solo" {
    driver = "raw_exec"

    config {
      command = "/bin/true"
    }
  }

  group "eval" {
    task "run" {
      driver = "exec"

      artifact {
        source      = "https://example.com/evals.tar.gz"
        destination = "local/evals"

        options {
          checksum = "sha256:abcd"
        }
      }

      identity {
        env  = true
        file = true
      }

      identity {
        name = "consul"
        aud  = ["consul.io"]
        ttl  = "1h"
      }

      config {
        command = "/usr/bin/python3"
        args    = ["-m", "evals"]
      }
    }
  }
}
"""

PLACEMENT_JSON: dict[str, object] = {
    "ID": "batch-eval",
    "Name": "batch-eval",
    "Type": "batch",
    "Constraints": [
        {"LTarget": "", "RTarget": "", "Operand": "distinct_hosts"},
        {"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="},
        {"LTarget": "${attr.nvidia.driver.version}", "RTarget": ">= 535.0", "Operand": "version"},
        {"LTarget": "${node.class}", "RTarget": "^gpu-", "Operand": "regexp"},
        {"LTarget": "${meta.rack}", "RTarget": "2", "Operand": "distinct_property"},
        {"LTarget": "${meta.llmgw_features}", "RTarget": "nvlink,ib", "Operand": "set_contains"},
    ],
    "Affinities": [{"LTarget": "${meta.llmgw_fabric}", "RTarget": "ib", "Operand": "=", "Weight": 50}],
    "Spreads": [
        {
            "Attribute": "${node.datacenter}",
            "Weight": 100,
            "SpreadTarget": [{"Value": "dc1", "Percent": 70}, {"Value": "dc2", "Percent": 30}],
        }
    ],
    "Periodic": {"Specs": ["0 3 * * *"], "ProhibitOverlap": True, "TimeZone": "UTC", "SpecType": "cron"},
    "ParameterizedJob": {"Payload": "optional", "MetaRequired": ["model"]},
    "Migrate": {
        "MaxParallel": 1,
        "HealthCheck": "checks",
        "MinHealthyTime": 10 * S,
        "HealthyDeadline": 300 * S,
    },
    "TaskGroups": [
        {
            # a job-level task becomes a group of its own, placed first
            "Name": "solo",
            "Tasks": [
                {
                    "Name": "solo",
                    "Driver": "raw_exec",
                    "Config": {"command": "/bin/true"},
                    "Vault": {
                        "Policies": ["llmgw-read"],
                        "Env": True,
                        "DisableFile": False,
                        "ChangeMode": "restart",
                    },
                }
            ],
        },
        {
            "Name": "eval",
            "Tasks": [
                {
                    "Name": "run",
                    "Driver": "exec",
                    "Artifacts": [
                        {
                            "GetterSource": "https://example.com/evals.tar.gz",
                            "RelativeDest": "local/evals",
                            "GetterOptions": {"checksum": "sha256:abcd"},
                        }
                    ],
                    # the unnamed identity is the default one: it moves to Task.Identity
                    "Identity": {"Env": True, "File": True},
                    "Identities": [{"Name": "consul", "Audience": ["consul.io"], "TTL": 3600 * S}],
                    "Config": {"command": "/usr/bin/python3", "args": ["-m", "evals"]},
                    "Vault": {
                        "Policies": ["llmgw-read"],
                        "Env": True,
                        "DisableFile": False,
                        "ChangeMode": "restart",
                    },
                }
            ],
        },
    ],
}

FIXTURES: dict[str, tuple[str, dict[str, object]]] = {
    "engine": (ENGINE, ENGINE_JSON),
    "prestart_templates_variables": (PRESTART, PRESTART_JSON),
    "placement_and_top_level_extras": (PLACEMENT, PLACEMENT_JSON),
}
