"""Benchmark: from the control plane's leader crashing to another instance leading, at Consul's real timing.

The Consul stand-in runs with its defaults, which are real Consul's rules: a session TTL
of at least 10 s, invalidated only after 2 x TTL without a renewal, lock-delay applied
after an invalidation (at most 60 s), TTL checks that go critical when not passed. The
leader is a separate process (this script with ``--lead``) running ``LeaderElection``
with llmgw's default ``ElectionSettings``; once it leads, a standby starts in this process,
the leader is killed with SIGKILL (no release, no goodbye), and the time until the standby
leads is printed. ``--ttl-only`` runs the same with the session tied to no process check
(and a 15 s TTL and lock-delay), to show what the check saves.

    python bench/leader_failover.py [--runs 3] [--ttl-only]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import statistics
import sys
from dataclasses import replace

from llmgw.adapters.consul import ConsulClient, ElectionSettings, LeaderElection
from llmgw.devcluster.consul import ConsulSettings, ConsulStandIn
from llmgw.settings import ConsulConnection

SCRIPT = os.path.abspath(__file__)  # this file, run again as the leader process
# An election whose session rests on its TTL alone: 15 s TTL and lock-delay.
TTL_ONLY = ElectionSettings(ttl=15.0, lock_delay=15.0, acquire_retry_interval=5.0, process_check_ttl=None)


def settings_for(args: argparse.Namespace) -> ElectionSettings:
    return TTL_ONLY if args.ttl_only else ElectionSettings()


async def lead(url: str, settings: ElectionSettings) -> None:
    """``--lead``: campaign, say so once leading, then run until killed."""
    async with ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": url})) as client:
        election = LeaderElection(client, "bench-leader", settings)
        await election.start()
        await election.wait_for_leadership()
        print("leading", flush=True)
        await asyncio.Event().wait()


async def one_failover(consul: ConsulStandIn, settings: ElectionSettings, ttl_only: bool) -> float:
    argv = [sys.executable, SCRIPT, "--lead", consul.url]
    if ttl_only:
        argv.append("--ttl-only")
    leader = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    assert leader.stdout is not None
    try:
        line = await asyncio.wait_for(leader.stdout.readline(), 60)
        if line.strip() != b"leading":
            raise RuntimeError(f"the leader process did not lead: {line!r}")
        async with ConsulClient(ConsulConnection.from_env({"CONSUL_HTTP_ADDR": consul.url})) as client:
            standby = LeaderElection(client, "bench-standby", settings)
            await standby.start()
            try:
                # Let the standby settle into waiting on the held lock, renewals flowing.
                await asyncio.sleep(settings.renew_every * 2)
                if standby.is_leader:
                    raise RuntimeError("the standby leads while the leader lives")
                loop = asyncio.get_running_loop()
                leader.send_signal(signal.SIGKILL)
                crashed_at = loop.time()
                await asyncio.wait_for(standby.wait_for_leadership(), 300)
                return loop.time() - crashed_at
            finally:
                await standby.stop()
    finally:
        if leader.returncode is None:
            leader.kill()
        await leader.wait()


async def bench(args: argparse.Namespace) -> None:
    settings = settings_for(args)
    real = ConsulSettings()
    print("leader failover after a crash, on the Consul stand-in at real Consul's rules:")
    rows = [
        ("Consul: session TTL at least", f"{real.session_ttl_min:g} s"),
        ("Consul: an unrenewed session is invalidated after", f"{real.session_ttl_multiplier:g} x TTL"),
        ("Consul: lock-delay applied at most", f"{real.max_lock_delay:g} s"),
        ("llmgw: session TTL", f"{settings.ttl:g} s"),
        ("llmgw: lock-delay", f"{settings.lock_delay:g} s"),
        (
            "llmgw: the session is tied to a process check of TTL",
            "none" if settings.process_check_ttl is None else f"{settings.process_check_ttl:g} s",
        ),
        ("llmgw: a refused acquire is retried every", f"{settings.acquire_retry_interval:g} s"),
    ]
    for name, value in rows:
        print(f"  {name:<56} {value}")
    if settings.process_check_ttl is None:
        low = settings.ttl * real.session_ttl_multiplier - settings.renew_every + settings.lock_delay
        high = (
            settings.ttl * real.session_ttl_multiplier + settings.lock_delay + settings.acquire_retry_interval
        )
    else:
        low = settings.lock_delay
        high = settings.process_check_ttl + settings.lock_delay + settings.acquire_retry_interval
    print(f"  => expected between about {low:g} s and {high:g} s")
    times: list[float] = []
    async with ConsulStandIn(replace(real)) as consul:
        for run in range(args.runs):
            took = await one_failover(consul, settings, args.ttl_only)
            times.append(took)
            print(f"  run {run + 1}: the standby led {took:.1f} s after the leader was killed", flush=True)
    print(
        f"failover after a crash: median {statistics.median(times):.1f} s, "
        f"max {max(times):.1f} s over {len(times)} run(s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--ttl-only",
        action="store_true",
        help="the session tied to no process check, with a 15 s TTL and lock-delay",
    )
    parser.add_argument("--lead", metavar="CONSUL_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.lead:
        asyncio.run(lead(args.lead, settings_for(args)))
        return
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
