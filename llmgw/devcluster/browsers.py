"""The stand-ins answer programs, never web pages: requests a browser sent for a page are refused.

The Nomad stand-in runs the commands of the jobs it is given (raw_exec, as the
developer), and neither stand-in checks an ACL token unless told to: any request
that reaches one can run code on the developer's machine. They listen on
loopback only, but a web page in the developer's browser can reach loopback
too: a "simple" cross-site POST (``text/plain``, no preflight) is sent, and the
stand-ins read JSON whatever the Content-Type says; a DNS-rebinding page reaches
it under its own host name and may even read the answers.

Nomad's and Consul's clients (their CLIs, python-nomad, py-consul, llmgw's own
adapters) never send ``Origin`` or ``Sec-Fetch-*`` and always name the address
they dialled in ``Host``. So: ``Host`` must be an IP address or ``localhost``
(421 otherwise), and a request carrying ``Origin``, or a ``Sec-Fetch-Site`` other
than ``none`` (an address typed into the browser), is refused (403). Opening a
stand-in's URL in the browser to look at its JSON still works.

Must not: know either stand-in's API (each adds this middleware to its app).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from llmgw.core.addresses import host_of_header, is_ip_or_localhost

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def browser_refusal(host: str | None, origin: str | None, fetch_site: str | None) -> tuple[int, str] | None:
    """(status, why) for a request a web page may have sent, or None for a program's."""
    name = host_of_header(host) if host else None
    if name is None:
        return 421, "the request has no usable Host header"
    if not is_ip_or_localhost(name):
        return 421, f"the dev stand-ins answer to an IP address or localhost in Host, not {name[:100]!r}"
    if origin is not None:
        return 403, f"the request comes from a web page at {origin[:100]!r}; the dev stand-ins serve programs"
    if fetch_site is not None and fetch_site.lower() != "none":
        return 403, f"the browser marked this request as {fetch_site[:40]} (Sec-Fetch-Site)"
    return None


@web.middleware
async def refuse_browsers(request: web.Request, handler: Handler) -> web.StreamResponse:
    refusal = browser_refusal(
        request.headers.get("Host"), request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site")
    )
    if refusal is not None:
        status, why = refusal
        return web.Response(status=status, text=why + "\n", content_type="text/plain")
    return await handler(request)
