"""Benchmark: render and parse llmgw-sized Nomad jobs with the stand-in's jobspec2 parser.

Prints figures only (no assertions): time to parse one ~200-line job, and to render
(jinja2) + parse + key-check 1,000 distinct jobs. Target: under two seconds for the
1,000, rendering included. Run: ``.venv/bin/python bench/jobspec_parse.py``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import jinja2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmgw.apispec import check_document
from llmgw.apispec.jobspec import parse_jobspec

_GROUP = """
  group "{{ g.name }}" {
    count = {{ g.count }}

    network {
      mode = "host"
      port "http" {}
      port "metrics" {
        static = {{ 9100 + loop.index }}
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

    service {
      name = "llmgw-engine"
      port = "http"
      tags = ["model={{ model }}", "group={{ g.name }}"]

      check {
        type     = "http"
        path     = "/health"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "fetch" {
      driver = "raw_exec"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        command = "/usr/local/bin/llmgw"
        args    = ["mirror", "fetch", "{{ model }}"]
      }
    }

    task "engine" {
      driver         = "docker"
      kill_timeout   = "45s"
      shutdown_delay = "5s"

      config {
        image = "vllm/vllm-openai:v0.6.3"
        args  = ["--model", "/models/{{ model }}", "--port", "${NOMAD_PORT_http}"]
        ports = ["http"]
      }

      env {
        HF_HOME = "/models/hf"
        NODE    = "${attr.unique.hostname}"
      }

      template {
        destination = "local/peers"
        data        = <<EOT
{{ '{{' }} range service "llmgw-engine" {{ '}}' }}{{ '{{' }} .Address {{ '}}' }}
{{ '{{' }} end {{ '}}' }}
EOT
      }

      resources {
        cpu    = 4000
        memory = 32768

        device "nvidia/gpu" {
          count = {{ g.gpus }}

          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "40 GiB"
          }
        }
      }

      logs {
        max_files     = 5
        max_file_size = 20
      }
    }
  }
"""

_JOB = (
    """job "llm-{{ model }}" {
  datacenters = ["dc1"]
  type        = "service"

  meta {
    llmgw_model = "{{ model }}"
    llmgw_spec  = "{{ spec }}"
  }

  constraint {
    distinct_hosts = true
  }

  update {
    max_parallel     = 1
    min_healthy_time = "30s"
    healthy_deadline = "10m"
    auto_revert      = true
  }
{% for g in groups %}"""
    + _GROUP
    + """{% endfor %}}
"""
)


def main() -> None:
    template = jinja2.Environment(autoescape=False, keep_trailing_newline=True).from_string(_JOB)
    groups = [{"name": f"g{i}", "count": 2, "gpus": 1 + i % 2} for i in range(2)]
    sample = template.render(model="qwen", spec="0", groups=groups)
    lines = sample.count("\n")

    for _ in range(20):  # warm up
        parse_jobspec(sample)
    runs = []
    for _ in range(200):
        t0 = time.perf_counter()
        parse_jobspec(sample)
        runs.append(time.perf_counter() - t0)
    print(
        f"one job of {lines} lines: median {statistics.median(runs) * 1e3:.2f} ms, "
        f"p95 {sorted(runs)[int(len(runs) * 0.95)] * 1e3:.2f} ms"
    )

    t0 = time.perf_counter()
    render_s = parse_s = check_s = 0.0
    for i in range(1000):
        a = time.perf_counter()
        text = template.render(model=f"m{i}", spec=str(i), groups=groups)
        b = time.perf_counter()
        job = parse_jobspec(text)
        c = time.perf_counter()
        problems = check_document(job, "Job")
        d = time.perf_counter()
        if problems:
            raise SystemExit(f"job {i} is not key-exact: {problems[0]}")
        render_s += b - a
        parse_s += c - b
        check_s += d - c
    total = time.perf_counter() - t0
    print(
        f"1000 jobs: {total:.2f} s total (render {render_s:.2f} s, parse {parse_s:.2f} s, "
        f"key-check {check_s:.2f} s); target < 2 s"
    )


if __name__ == "__main__":
    main()
