"""The engine security policy's last door: the simulated engine refuses a start it forbids.

Owns: ``refusals(settings, argv, environ)``, called by ``server.main`` after the
settings are parsed and before anything is served; any reason makes the start fail
with ExitCode.REFUSED and one logged line per reason. It is a pure check: it reads the
bundled policy (``policies/engine-security.yaml``, never a path from the command line
or the environment, which whoever edited the job controls) and what it is given, and
does not exit.

What it refuses:

- **Flags** the policy denies for ``engine: sim`` (``check_args`` of
  ``llmgw.core.catalog.security``, with the engine's abbreviation rules). The flags
  llmgw owns (``--host``, ``--port``, ``--model``...) are on every legitimate command
  line, put there by the renderer, so only the deny list applies here: "owned" means
  "a catalog must not set it", which this door cannot tell from the argv.
- **Environment** that changes what runs: the loader and interpreter controls the
  renderer never writes into a job (``llmgw.core.catalog.security.PROCESS_ALTERING_ENV``,
  plus ``OPENSSL_CONF``). The rest of the policy's env rules are about what a *catalog*
  may add: a process's environment also holds what the node and Nomad set
  (``NOMAD_*``, ``HOME``, ``NVIDIA_VISIBLE_DEVICES``, ``LLMGW_SIM_*``...), which this
  door cannot tell apart from a catalog's, so the allowlist cannot apply here.
  ``PATH`` is not refused (every process has one; Nomad sets it), and neither are the
  Python switches that change no code (``PYTHONUNBUFFERED``, ``PYTHONDONTWRITEBYTECODE``...,
  ``TOLERATED_ENV``), which container images commonly set.

What it cannot stop, honestly: by the time this runs, the dynamic loader has applied
``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT`` and ``GLIBC_TUNABLES``, and Python has
applied ``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONWARNINGS``, ``PYTHONSTARTUP``-like
settings and ``.pth`` files before any llmgw code is imported. A library preloaded into
the process can do anything before this check, or make it answer "allowed". Refusing
here still turns a hand-edited job into a loud failure instead of a quiet success
(the usual case: someone adds a flag, not an exploit), and a refused flag never
reaches the engine's parser. What stops the rest is earlier: the renderer refuses such
a profile or template (``Renderer.render`` / ``check_job``), and Nomad ACLs decide who may
submit or edit a job at all (``submit-job`` on the namespace; llmgw's jobs carry
``llmgw_managed_by`` meta, which ACLs do not check). Treat anyone who can register jobs
in llmgw's namespace as able to run anything on the nodes.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from llmgw.bundled import read_security_policy
from llmgw.core.catalog import Engine, SecurityPolicy
from llmgw.core.catalog.security import PROCESS_ALTERING_ENV, check_args
from llmgw.sim.settings import SimSettings

# Environment that changes which program runs or what code it loads: the policy's
# list, less PATH (every process has one).
REFUSED_ENV = tuple(pattern for pattern in PROCESS_ALTERING_ENV if pattern != "PATH")
# Python switches that change how the interpreter reports or buffers, never which code
# runs; images set them routinely (python:3 images, CI runners).
TOLERATED_ENV = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONHASHSEED",
        "PYTHONFAULTHANDLER",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONCOERCECLOCALE",
    }
)


def refusals(
    settings: SimSettings,
    argv: Sequence[str],
    environ: Mapping[str, str],
    policy: SecurityPolicy | None = None,
) -> tuple[str, ...]:
    """Every reason to refuse this start, each saying what to change; empty allows it.
    ``policy`` is for tests; a running sim always uses the bundled one."""
    del settings  # the policy judges the command line as given, not what it parsed to
    chosen = policy or read_security_policy()
    # Only what the sim's parser reads as flags: values (a model path, a served name) come
    # from llmgw, and the sim's parser reads no @file arguments.
    flags = [arg for arg in argv if arg.startswith("-")]
    reasons = [
        f"{v.message}; remove it from the job" for v in check_args(_deny_only(chosen), Engine.SIM, flags)
    ]
    for name in sorted(environ):
        reason = env_refusal(name, chosen)
        if reason is not None:
            reasons.append(f"environment variable {name} is refused: {reason}; remove it from the job")
    return tuple(reasons)


def env_refusal(name: str, policy: SecurityPolicy) -> str | None:
    upper = name.upper()
    if upper in TOLERATED_ENV or not any(fnmatch.fnmatchcase(upper, p) for p in REFUSED_ENV):
        return None
    env = policy.env
    if upper in env.deny_names:
        return env.deny_names[upper]
    for pattern, reason in env.deny_patterns.items():
        if fnmatch.fnmatchcase(upper, pattern.upper()):
            return reason
    return "it changes which program runs or what code it loads"


def _deny_only(policy: SecurityPolicy) -> SecurityPolicy:
    sim = policy.args.get(Engine.SIM)
    if sim is None:
        return policy  # check_args then says the policy has no section for the sim
    return policy.model_copy(
        update={"args": {**policy.args, Engine.SIM: sim.model_copy(update={"owned": {}})}}
    )
