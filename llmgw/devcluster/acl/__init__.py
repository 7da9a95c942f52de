"""ACLs of the dev stand-ins, as Nomad 2.0.5 and Consul enforce them.

Public face: :class:`NomadAcl` and :class:`ConsulAcl` (a token's merged policies, asked
"may it?"), :func:`parse_nomad_policy` and :func:`parse_consul_policy` (the policy
languages' subset llmgw's policy files use), :class:`TokenBook` (secret -> who, which
policies, management or not) and :func:`ops_policies` (the policy files in ``ops/acl/``
that ``llmgw dev`` and the tests give every component). ``DESIGN.md`` beside the
stand-ins cites the real source of each rule.
"""

from llmgw.devcluster.acl.consul_rules import ConsulAcl, ConsulDenied, parse_consul_policy
from llmgw.devcluster.acl.nomad_rules import NomadAcl, parse_nomad_policy
from llmgw.devcluster.acl.policy_files import (
    CONSUL_COMPONENTS,
    NOMAD_COMPONENTS,
    PolicyProblem,
    ops_policies,
    policy_dir,
)
from llmgw.devcluster.acl.tokens import Denial, Identity, TokenBook

__all__ = [
    "CONSUL_COMPONENTS",
    "NOMAD_COMPONENTS",
    "ConsulAcl",
    "ConsulDenied",
    "Denial",
    "Identity",
    "NomadAcl",
    "PolicyProblem",
    "TokenBook",
    "ops_policies",
    "parse_consul_policy",
    "parse_nomad_policy",
    "policy_dir",
]
