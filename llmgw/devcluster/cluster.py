"""``DevCluster``: the Consul and Nomad stand-ins started together and wired like a real cluster.

Owns: starting the Consul stand-in, one Consul agent per simulated Nomad node (a Nomad
client registers its allocations' services with the agent on its own machine), the
Nomad stand-in pointed at those agents, and linking node faults (a failed Nomad node's
Consul agent fails too, as a dead machine's would), and the ACL tokens: both stand-ins
run with ACLs on, each with a management token drawn from ``secrets`` unless the config
names one (the operator's: ``nomad_token``, ``consul_token``, ``llmgw dev``'s token
files), and one token per llmgw component carrying exactly its ``ops/acl/`` policy
(``nomad_tokens``, ``consul_tokens``: control plane, router, CI, status, Nomad's
agents). The Nomad stand-in's clients send the Nomad agents' Consul token to their
agents; the engines' tasks log in to Consul's ``nomad-workloads`` auth method, whose
binding rule gives them the role ``nomad-default-tasks`` with the engine tasks' policy.

The two stand-ins stay coupled only through Consul's HTTP API; this module only hands
addresses and the Consul token from one to the other.

Must not: contain scheduling or Consul logic.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmgw.devcluster.acl import (
    CONSUL_COMPONENTS,
    NOMAD_COMPONENTS,
    ConsulAcl,
    NomadAcl,
    ops_policies,
    parse_consul_policy,
    parse_nomad_policy,
)
from llmgw.devcluster.acl.consul_rules import ConsulPolicy
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.devcluster.consul.state import AuthMethod
from llmgw.devcluster.nomad import NomadServer, NomadStandIn, StandInConfig

# The Consul role the binding rule gives the engines' tasks in namespace "default"
# (nomad setup consul: nomad-${value.nomad_namespace}-tasks) and the auth method's name.
TASK_ROLE = "nomad-default-tasks"


def new_acl_token() -> str:
    """A secret in the form of Nomad's and Consul's SecretIDs (a random UUID), from ``secrets``."""
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))


@dataclass(frozen=True)
class DevClusterConfig:
    nomad: StandInConfig = field(default_factory=StandInConfig)
    consul: ConsulSettings | None = None  # None: real Consul's clocks
    # Each stand-in's ACL token is ``nomad.acl_token`` / ``consul.acl_token`` when set,
    # else a fresh one: the dev cluster never runs with ACLs off.
    state_dir: Path | None = None  # overrides nomad.state_dir when set
    nomad_port: int = 0  # 0: a free port
    consul_port: int = 0
    # The ACL policies the components' tokens carry, by ops/acl file name
    # ("nomad-control-plane", "consul-router", ...); None reads ops/acl/ itself.
    acl_policies: dict[str, str] | None = None
    # False: an empty ACL-enabled cluster, as an operator finds one after bootstrapping:
    # the two management tokens only, no component token, no auth method or role (the
    # deploy guide's first step makes them over the ACL APIs); Nomad's agents get their
    # Consul token from ``configure_nomad_agents``, as from their agent config.
    provision_acl: bool = True


class DevCluster:
    """``async with DevCluster(DevClusterConfig()) as dev: dev.nomad_addr, dev.nomad_token, ...``."""

    def __init__(self, config: DevClusterConfig | None = None) -> None:
        self.config = config or DevClusterConfig()
        consul_settings = self.config.consul or ConsulSettings()
        self.consul_token: str = consul_settings.acl_token or new_acl_token()
        self.nomad_token: str = self.config.nomad.acl_token or new_acl_token()
        self.consul = ConsulStandIn(
            replace(consul_settings, acl_token=self.consul_token), port=self.config.consul_port
        )
        self.nomad: NomadStandIn | None = None
        self._server: NomadServer | None = None
        self.policies = self.config.acl_policies if self.config.acl_policies is not None else ops_policies()
        # Each component's own token (its ops/acl policy), by component name.
        self.nomad_tokens: dict[str, str] = {}
        self.consul_tokens: dict[str, str] = {}
        self._signing_key = secrets.token_bytes(32)
        if self.config.provision_acl:
            self.consul_tokens = {
                who: self._issue_consul(who) for who in CONSUL_COMPONENTS if who != "engine-tasks"
            }
            self.consul.state.auth_methods["nomad-workloads"] = AuthMethod(
                key=self._signing_key,
                roles={TASK_ROLE: tuple(self._consul_policies("engine-tasks"))},
            )

    def _consul_policies(self, who: str) -> list[ConsulPolicy]:
        text = self.policies.get(f"consul-{who}")
        return [] if text is None else [parse_consul_policy(text, f"consul-{who}.policy.hcl")]

    def _issue_consul(self, who: str) -> str:
        accessor = new_acl_token()
        acl = ConsulAcl.of(accessor, self._consul_policies(who))
        return self.consul.state.tokens.issue(who, acl, accessor)

    def _nomad_acl(self, who: str) -> NomadAcl:
        text = self.policies.get(f"nomad-{who}")
        return NomadAcl.of([] if text is None else [parse_nomad_policy(text, f"nomad-{who}.policy.hcl")])

    @property
    def identity_signing_key(self) -> bytes:
        """The key the Nomad stand-in signs workload identities with and Consul's
        ``nomad-workloads`` auth method verifies (real Nomad: its keyring and JWKS URL)."""
        return self._signing_key

    @property
    def nomad_addr(self) -> str:
        if self._server is None:
            raise RuntimeError("the dev cluster is not started")
        return self._server.address

    @property
    def nomad_jwks_url(self) -> str:
        """Where a real Nomad serves its workload identities' keys (``/.well-known/jwks.json``)."""
        return f"{self.nomad_addr}/.well-known/jwks.json"

    def configure_nomad_agents(self, consul_token: str) -> None:
        """Nomad's agents with ``consul { token = ... }`` in their config (as after a restart
        with it): the services of allocations placed from now on register with it."""
        if self.nomad is None:
            raise RuntimeError("the dev cluster is not started")
        self.nomad.configure_consul_token(consul_token)

    @property
    def consul_addr(self) -> str:
        return self.consul.url

    async def start(self) -> None:
        await self.consul.start()
        try:
            nomad_config = self.config.nomad
            agents: dict[str, str] = {}
            for node in nomad_config.nodes:
                agents[node.name] = await self.consul.add_node(node.name, "127.0.0.1")
            nomad_config = nomad_config.with_overrides(
                consul_addr=self.consul.url,
                consul_agents=agents,
                # Nomad's agents carry their own token (ops/acl/consul-nomad-agent.policy.hcl).
                consul_token=self.consul_tokens.get("nomad-agent"),
                identity_signing_key=self._signing_key,
                acl_token=self.nomad_token,
                state_dir=self.config.state_dir or nomad_config.state_dir,
            )
            self.nomad = NomadStandIn(nomad_config)
            if self.config.provision_acl:
                for who in NOMAD_COMPONENTS:
                    self.nomad_tokens[who] = self.nomad.tokens.issue(who, self._nomad_acl(who))
            self.nomad.on_node_failed.append(self.consul.fail_node)
            self.nomad.on_node_restored.append(self.consul.recover_node)
            self._server = NomadServer(self.nomad, port=self.config.nomad_port)
            await self._server.start()
            # Consul's auth method verifies task identities against Nomad's JWKS: here the
            # key the stand-ins share, under the URL a real Nomad serves it at.
            self.consul.state.acl_objects.jwks_keys[self.nomad_jwks_url] = self._signing_key
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        # Nomad first: its tasks deregister nothing on the way down (they are killed), and
        # no process may outlive the cluster.
        if self._server is not None:
            await self._server.stop()
            self._server = None
        elif self.nomad is not None:
            await self.nomad.stop()
        await self.consul.stop()

    async def __aenter__(self) -> DevCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
