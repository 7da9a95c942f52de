"""The ACL objects an operator made over Consul's ACL API (``handlers_acl_admin.py``), kept
with the rest of a stand-in cluster's state. Plain records as Consul returns them.

Must not: decide access or answer HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.devcluster.acl.consul_rules import ConsulPolicy


@dataclass
class AclObjects:
    """What the ACL API made, each as Consul returns it (dicts with ID, Name, ...)."""

    policies: dict[str, dict[str, object]] = field(default_factory=dict)  # by ID
    parsed: dict[str, ConsulPolicy] = field(default_factory=dict)  # by policy name
    roles: dict[str, dict[str, object]] = field(default_factory=dict)  # by ID
    methods: dict[str, dict[str, object]] = field(default_factory=dict)  # by name
    rules: dict[str, dict[str, object]] = field(default_factory=dict)  # by ID
    tokens: dict[str, dict[str, object]] = field(default_factory=dict)  # by SecretID
    # JWKS URL -> the key identities are signed with (DevCluster sets the Nomad stand-in's).
    jwks_keys: dict[str, bytes] = field(default_factory=dict, repr=False)
