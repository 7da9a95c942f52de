"""What the router costs over talking to an engine directly, with nginx as the reference proxy.

Starts one simulated engine process, the router in its own process (endpoints fixed,
no Consul) and, if Debian's nginx is installed (or can be: ``apt-get install -y
nginx``), nginx with ``proxy_buffering off`` in front of the same engine. A load
generator in this process (aiohttp, loopback only) then runs C concurrent clients
for a few seconds against each target, streaming and not, and prints:

- delivered tokens/s and the router's ratio to direct (target >= 0.97 at 64 streams
  of 50 tokens/s),
- time to first token p50/p99 and what the router and nginx add (target < 1 ms p50,
  < 5 ms p99),
- non-streamed latency p50/p99 and the added latency, router vs nginx (target: the
  router's within 2x nginx's),
- at saturation (an engine as fast as it goes), the router's CPU time per forwarded
  SSE event, from /proc.

Prints figures; asserts nothing. The three processes and the client share this
machine's cores, so figures on a 2-core box are upper bounds of the overhead.

    .venv/bin/python bench/router_proxy.py                       # 64 streams, 50 tokens/s, 5 s each
    .venv/bin/python bench/router_proxy.py --concurrency 16 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

MODEL = "bench"
CATALOG = f"""
models:
  {MODEL}:
    roles: [chat, completion]
    profiles: [{{engine: sim}}]
    scaling: {{min: 1, max: 1}}
"""
ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve()
NGINX_DEBIAN = Path("/usr/sbin/nginx")


# --- the processes ----------------------------------------------------------------------------------


async def _start(args: list[str], pattern: bytes) -> tuple[asyncio.subprocess.Process, int]:
    """Start a process that prints ``... port=N`` on stdout once it listens."""
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=ROOT
    )
    assert process.stdout is not None
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if not line:
            raise RuntimeError(f"{args[:3]} exited before listening")
        if pattern in line:
            return process, int(line.rsplit(b"port=", 1)[1].split()[0])


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            process.kill()
            await process.wait()


async def start_sim(token_rate: float, max_tokens: int) -> tuple[asyncio.subprocess.Process, int]:
    return await _start(
        [
            sys.executable, "-m", "llmgw.sim", "--host", "127.0.0.1", "--port", "0", "--load-time", "0",
            "--served-model-name", MODEL, "--token-rate", str(token_rate), "--max-num-seqs", "4096",
            "--max-model-len", str(max_tokens + 1000), "--log-level", "WARNING",
        ],
        b"llmgw-sim listening",
    )  # fmt: skip


async def start_router(engine_port: int, loop: str = "asyncio") -> tuple[asyncio.subprocess.Process, int]:
    return await _start(
        [
            sys.executable,
            str(SELF),
            "--serve-router",
            "--engine-port",
            str(engine_port),
            "--router-loop",
            loop,
        ],
        b"router listening",
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _nginx_binary() -> str | None:
    return shutil.which("nginx") or (str(NGINX_DEBIAN) if NGINX_DEBIAN.exists() else None)


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@contextlib.asynccontextmanager
async def nginx(engine_port: int) -> AsyncIterator[int | None]:
    """nginx in front of the engine, or None (with a message) if it is not to be had."""
    binary = _nginx_binary()
    if binary is None and os.geteuid() == 0 and shutil.which("apt-get"):
        print("nginx: installing Debian's package (apt-get install -y nginx) ...", flush=True)
        subprocess.run(  # noqa: ASYNC221 - a one-off install before any measuring
            ["apt-get", "install", "-y", "-q", "nginx"],
            capture_output=True,
            check=False,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        binary = _nginx_binary()
    if binary is None:
        print("nginx: not installed and could not be installed; skipping the nginx reference")
        yield None
        return
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-nginx-") as tmp:
        user = "user root;" if os.geteuid() == 0 else ""
        temps = " ".join(
            f"{kind}_temp_path {tmp}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        _write(
            Path(tmp, "nginx.conf"),
            f"""
{user}
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  {temps}
  upstream engine {{ server 127.0.0.1:{engine_port}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
""",
        )
        process = await asyncio.create_subprocess_exec(
            binary, "-p", tmp, "-c", f"{tmp}/nginx.conf", "-g", "daemon off;",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            for _ in range(100):
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.05)
            else:
                print(f"nginx: did not start; skipping the nginx reference ({_read(Path(tmp, 'error.log'))})")
                yield None
                return
            yield port
        finally:
            await _stop(process)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the load ---------------------------------------------------------------------------------------


@dataclass
class Run:
    name: str
    seconds: float = 0.0
    requests: int = 0
    tokens: int = 0
    events: int = 0
    failures: int = 0
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def load(
    name: str,
    url: str,
    *,
    concurrency: int,
    seconds: float,
    max_tokens: int,
    stream: bool,
    spread: float = 0.0,
) -> Run:
    """``concurrency`` clients, each sending its next request when its last one ended, for
    ``seconds``. Their first requests are spread over ``spread`` seconds so arrivals are
    even, as in real traffic, instead of all landing in the same millisecond."""
    run = Run(name)
    loop = asyncio.get_running_loop()
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "benchmark the proxy"}],
         "max_tokens": max_tokens, "stream": stream}
    ).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        stop_at = loop.time() + seconds

        async def client(index: int) -> None:
            await asyncio.sleep(spread * index / concurrency)
            while loop.time() < stop_at:
                started = loop.time()
                try:
                    async with session.post(
                        url + "/v1/chat/completions", data=body, headers=headers
                    ) as response:
                        if response.status != 200:
                            run.failures += 1
                            await response.read()
                            continue
                        if stream:
                            first = True
                            async for line in response.content:
                                if line.startswith(b"data: {"):
                                    run.events += 1
                                    if b'"content":"' in line and b'"content":""' not in line:
                                        run.tokens += 1
                                        if first:
                                            run.ttft.append(loop.time() - started)
                                            first = False
                        else:
                            data = await response.json()
                            run.tokens += int(data["usage"]["completion_tokens"])
                except aiohttp.ClientError:
                    run.failures += 1
                    continue
                run.latency.append(loop.time() - started)
                run.requests += 1

        began = loop.time()
        await asyncio.gather(*(client(i) for i in range(concurrency)))
        run.seconds = loop.time() - began
    return run


def report(direct: Run, router: Run, proxy: Run | None, *, stream: bool) -> None:
    ms = 1000.0
    print(f"\n{'streaming' if stream else 'non-streamed'}:")
    print(f"  {'target':<8} {'req':>6} {'fail':>5} {'tokens/s':>10} {'p50 ms':>9} {'p99 ms':>9}" + (
        f" {'ttft p50':>9} {'ttft p99':>9}" if stream else ""))  # fmt: skip
    for run in (direct, router, proxy):
        if run is None:
            continue
        line = (
            f"  {run.name:<8} {run.requests:>6} {run.failures:>5} {run.tokens_per_second:>10.0f} "
            f"{pct(run.latency, 0.5) * ms:>9.2f} {pct(run.latency, 0.99) * ms:>9.2f}"
        )
        if stream:
            line += f" {pct(run.ttft, 0.5) * ms:>9.2f} {pct(run.ttft, 0.99) * ms:>9.2f}"
        print(line)
    ratio = router.tokens_per_second / direct.tokens_per_second if direct.tokens_per_second else float("nan")
    print(f"  router/direct tokens/s: {ratio:.3f}  (target >= 0.97)")
    key = "ttft" if stream else "latency"
    for q, target in ((0.5, 1.0 if stream else None), (0.99, 5.0 if stream else None)):
        added = (pct(getattr(router, key), q) - pct(getattr(direct, key), q)) * ms
        text = f"  router added {'ttft' if stream else 'latency'} p{int(q * 100)}: {added:+.2f} ms"
        if target is not None:
            text += f" (target < {target:g} ms)"
        if proxy is not None:
            nginx_added = (pct(getattr(proxy, key), q) - pct(getattr(direct, key), q)) * ms
            text += f"; nginx added {nginx_added:+.2f} ms"
            if nginx_added > 0:
                text += f"; router/nginx {added / nginx_added:.2f}x (target <= 2x)"
        print(text)


async def main(args: argparse.Namespace) -> None:
    print(
        f"router proxy bench: {args.concurrency} concurrent clients, {args.max_tokens} tokens at "
        f"{args.token_rate:g} tokens/s per stream, {args.seconds:g} s per run, {os.cpu_count()} cores, "
        f"router on the {args.router_loop} event loop"
    )
    sim, sim_port = await start_sim(args.token_rate, args.max_tokens)
    router, router_port = await start_router(sim_port, args.router_loop)
    try:
        async with nginx(sim_port) as nginx_port:
            targets = {"direct": sim_port, "router": router_port}
            if nginx_port is not None:
                targets["nginx"] = nginx_port
            for stream in (True, False):
                runs = {}
                for name, port in targets.items():
                    # A short warm-up fills the connection pools.
                    await load(name, f"http://127.0.0.1:{port}", concurrency=args.concurrency, seconds=0.5,
                               max_tokens=args.max_tokens, stream=stream)  # fmt: skip
                    runs[name] = await load(
                        name, f"http://127.0.0.1:{port}", concurrency=args.concurrency, seconds=args.seconds,
                        max_tokens=args.max_tokens, stream=stream, spread=args.max_tokens / args.token_rate,
                    )  # fmt: skip
                report(runs["direct"], runs["router"], runs.get("nginx"), stream=stream)
    finally:
        await _stop(router)
        await _stop(sim)

    # Saturation: an engine as fast as it goes; the router's CPU per forwarded SSE event.
    sim, sim_port = await start_sim(100_000.0, args.max_tokens)
    router, router_port = await start_router(sim_port, args.router_loop)
    try:
        url = f"http://127.0.0.1:{router_port}"
        await load(
            "router", url, concurrency=args.concurrency, seconds=0.5, max_tokens=args.max_tokens, stream=True
        )
        before = cpu_seconds(router.pid)
        run = await load(
            "router",
            url,
            concurrency=args.concurrency,
            seconds=args.seconds,
            max_tokens=args.max_tokens,
            stream=True,
        )
        used = cpu_seconds(router.pid) - before
        print(
            f"\nsaturation: {run.events / run.seconds:.0f} SSE events/s through the router, "
            f"router CPU {used / run.seconds * 100:.0f}% of a core, "
            f"{used / max(run.events, 1) * 1e6:.1f} us of router CPU per forwarded event"
        )
    finally:
        await _stop(router)
        await _stop(sim)


# --- the router process -----------------------------------------------------------------------------


async def serve_router(engine_port: int) -> None:
    from llmgw.core.names import slug
    from llmgw.core.records import CatalogVersion, Endpoint, EndpointSnapshot, HealthStatus
    from llmgw.gateway.app import RouterServer
    from llmgw.gateway.ports import FixedValue, RouterDeps
    from llmgw.gateway.settings import RouterSettings

    endpoint = Endpoint(
        service_id="bench-0", node="local", model=MODEL, model_slug=slug(MODEL), replica="bench-r0",
        alloc_id="", address="127.0.0.1", port=engine_port, engine="sim", profile=0, simulated=True,
        status=HealthStatus.PASSING,
    )  # fmt: skip
    deps = RouterDeps(
        endpoints=FixedValue(EndpointSnapshot((endpoint,), 1), "endpoints"),
        catalog=FixedValue(CatalogVersion.of(1, CATALOG, "bench", 0.0), "catalog"),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with RouterServer(RouterSettings(host="127.0.0.1", port=0, no_auth=True), deps) as server:
        print(f"router listening port={server.port}", flush=True)
        await stop.wait()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--token-rate", type=float, default=50.0)
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--router-loop", choices=("asyncio", "uvloop"), default="asyncio",
        help="the router process's event loop (uvloop must be installed)",
    )  # fmt: skip
    parser.add_argument("--serve-router", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine-port", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve_router:
        import logging

        logging.basicConfig(level=logging.ERROR)
        if arguments.router_loop == "uvloop":
            try:
                import uvloop
            except ImportError:
                sys.exit("--router-loop uvloop: uvloop is not installed (pip install uvloop)")
            uvloop.run(serve_router(arguments.engine_port))
        else:
            asyncio.run(serve_router(arguments.engine_port))
    else:
        asyncio.run(main(arguments))
