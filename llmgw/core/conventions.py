"""The names llmgw's parts agree on inside Nomad and Consul.

The renderer writes them into jobs, the reconciler reads them back to adopt
what runs, and the routers watch them: one place, so the three cannot drift.
Changing a value here changes a wire format between llmgw versions that run
side by side during an upgrade; add, do not rename.
"""

from __future__ import annotations

from typing import Final

# --- Consul services ---------------------------------------------------------------------------
# Every replica's rank 0 registers ONE service name for all models, with the
# model in tags and meta, so a router watches every endpoint with one blocking
# query (a Consul agent allows 200 HTTP connections per client by default; one
# long poll per model would not scale to a thousand models).
ENGINE_SERVICE: Final = "llmgw-engine"
# Ranks >= 1 (and rank 0 again) register this one for rendezvous inside a replica;
# routers never read it.
RANK_SERVICE: Final = "llmgw-rank"
# llmgw's own processes, as ops/llmgw.nomad.hcl (and `llmgw dev`) register them: the
# routers' port (the API and /metrics), and each control plane's metrics listener.
# ops/prometheus/prometheus.yml finds its scrape targets by these names.
ROUTER_SERVICE: Final = "llmgw-router"
CONTROL_METRICS_SERVICE: Final = "llmgw-control-metrics"

# Service tags: "llmgw", then key=value tags for humans and for ?tag= filters.
SERVICE_TAG: Final = "llmgw"
TAG_MODEL: Final = "model"  # model=<slug>
TAG_REPLICA: Final = "replica"  # replica=<job id>
TAG_RANK: Final = "rank"  # rank=<n>

# Service meta keys (exact values; Consul meta values are strings).
META_MODEL: Final = "llmgw_model"  # the model's exact name
META_MODEL_SLUG: Final = "llmgw_model_slug"
META_REPLICA: Final = "llmgw_replica"  # replica id (the job's)
META_JOB: Final = "llmgw_job"  # Nomad job id
META_PROFILE: Final = "llmgw_profile"  # profile index in the model's list
META_ENGINE: Final = "llmgw_engine"
META_RANK: Final = "llmgw_rank"
META_ALLOC: Final = "nomad_alloc_id"  # ${NOMAD_ALLOC_ID}: joins Consul and Nomad data
META_SIMULATED: Final = "llmgw_simulated"  # "true" when the engine is sim

# --- Nomad job meta: what the reconciler needs to adopt a job after its own restart ------------
JOB_META_MANAGED_BY: Final = "llmgw_managed_by"  # always "llmgw": jobs without it are never touched
MANAGED_BY_VALUE: Final = "llmgw"
JOB_META_MODEL: Final = "llmgw_model"
JOB_META_PROFILE: Final = "llmgw_profile"
JOB_META_ENGINE: Final = "llmgw_engine"
JOB_META_REPLICA: Final = "llmgw_replica"
JOB_META_CATALOG_HASH: Final = "llmgw_catalog_hash"
JOB_META_SPEC_HASH: Final = (
    "llmgw_spec_hash"  # hash of what was rendered for this replica: "changed?" is a compare
)
JOB_META_VERSION: Final = "llmgw_version"
JOB_META_FABRIC: Final = "llmgw_fabric"
# The operator's restart generation of the model when the replica was placed (absent: 0).
# Not part of the spec hash: a restart replaces replicas without changing what they run.
JOB_META_RESTART_GENERATION: Final = "llmgw_restart_generation"

# Node meta attribute naming the fabric (the set of nodes one multi-node replica may span).
NODE_META_FABRIC: Final = "llmgw_fabric"

# --- Consul KV ---------------------------------------------------------------------------------
KV_ROOT: Final = "llmgw/"
# Each router writes its own key with the use it saw per model, in small batches
# (and at once for a wake-up of an on-demand model).
KV_DEMAND_PREFIX: Final = "llmgw/demand/"  # + <router id>
# The control plane marks replicas it drains; every router reads the marks.
KV_DRAINING_PREFIX: Final = "llmgw/draining/"  # + <job id>
KV_CATALOG_CURRENT: Final = "llmgw/catalog/current"
KV_CATALOG_HISTORY_PREFIX: Final = "llmgw/catalog/history/"  # + <zero-padded version>
KV_LEADER: Final = "llmgw/leader"
KV_KEYS_PREFIX: Final = "llmgw/keys/"  # + <key id>: API keys, hashed
KV_RESPONSES_PREFIX: Final = "llmgw/responses/"  # + <response id>: stored Responses API conversations
KV_STATUS: Final = "llmgw/status"  # the leader's last published status, for `llmgw status` anywhere
KV_STATUS_PARTS_PREFIX: Final = "llmgw/status/parts/"  # + <generation>/<part>: the status in pieces
# The models the leader cannot serve now (unplaceable, drained by an operator), one
# document for all of them so every router follows it with one blocking query.
KV_UNAVAILABLE: Final = "llmgw/unavailable"
# Operator commands per model (drain, restart), written by the admin API, read by every
# control-plane instance so any leader honours them.
KV_COMMANDS_PREFIX: Final = "llmgw/commands/"  # + <model slug>
