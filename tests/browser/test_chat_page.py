"""The chat page at ``/`` in headless Chromium: model order and preselection, the mark on
simulated models, a streamed answer, and which model and replica answered; and a new
user's first run: ``llmgw dev`` on the example catalog, the page, a message, an answer.

Needs Debian's chromium (``apt-get install -y chromium``) and the ``playwright``
package (its browsers are NOT downloaded: Debian's chromium is launched directly).
Skips with the reason when either is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from llmgw.core.names import slug
from llmgw.core.records import CatalogVersion, Endpoint, EndpointSnapshot, HealthStatus
from llmgw.gateway.app import RouterServer
from llmgw.gateway.ports import FixedValue, RouterDeps
from llmgw.gateway.settings import RouterSettings
from llmgw.sim.app import create_app as create_sim_app
from tests.support.sim import fast_settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

try:
    from playwright.async_api import Page, async_playwright, expect
except ImportError:  # pragma: no cover - depends on the machine
    async_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists() and shutil.which("chromium") is None, reason="needs Debian's chromium"
    ),
    pytest.mark.skipif(
        async_playwright is None, reason="needs the playwright package (pip install playwright)"
    ),
]

CATALOG = """
models:
  llama-real:
    description: a real model (served here by a simulated engine behind the router)
    roles: [chat]
    profiles: [{engine: vllm, source: org/llama}]
    scaling: {min: 1, max: 1}
  sim-chat:
    roles: [chat]
    profiles: [{engine: sim}]
    scaling: {min: 1, max: 1}
  embed:
    roles: [embedding]
    profiles: [{engine: sim}]
    scaling: {min: 1, max: 1}
  zz-real:
    roles: [chat]
    profiles: [{engine: vllm, source: org/zz}]
    scaling: {min: 1, max: 1}
aliases:
  fast: sim-chat
"""


def _endpoint(model: str, port: int, simulated: bool) -> Endpoint:
    return Endpoint(
        service_id=f"{slug(model)}-0",
        node="node-1",
        model=model,
        model_slug=slug(model),
        replica=f"{model}-r0",
        alloc_id="a0",
        address="127.0.0.1",
        port=port,
        engine="sim" if simulated else "vllm",
        profile=0,
        simulated=simulated,
        status=HealthStatus.PASSING,
    )


@contextlib.asynccontextmanager
async def _router_serving(*served: tuple[str, bool], catalog: str = CATALOG) -> AsyncIterator[RouterServer]:
    """A router whose endpoints are real sim engines for ``(model, simulated)`` pairs."""
    runners: list[web.AppRunner] = []
    endpoints = []
    for model, simulated in served:
        runner = web.AppRunner(create_sim_app(fast_settings(served_model_name=model, token_rate=200.0)))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        endpoints.append(_endpoint(model, runner.addresses[0][1], simulated))
    deps = RouterDeps(
        endpoints=FixedValue(EndpointSnapshot(tuple(endpoints), 1), "endpoints"),
        catalog=FixedValue(CatalogVersion.of(1, catalog, "test", 1.0), "catalog"),
    )
    server = RouterServer(RouterSettings(host="127.0.0.1", port=0, no_auth=True), deps)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    async with _router_serving(("llama-real", False), ("sim-chat", True)) as server:
        yield server


@pytest.fixture
async def page() -> AsyncIterator[Any]:
    assert async_playwright is not None
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = await browser.new_page()
        yield page
        await browser.close()


async def _options(page: Page) -> list[tuple[str, str]]:
    values: list[tuple[str, str]] = await page.eval_on_selector_all(
        "#model option", "options => options.map(o => [o.value, o.textContent])"
    )
    return [tuple(v) for v in values]  # type: ignore[misc]


async def test_real_models_first_and_preselected_simulated_ones_marked(
    router: RouterServer, page: Page
) -> None:
    await page.goto(router.url + "/")
    await expect(page.locator("#model option")).to_have_count(4)
    options = await _options(page)
    # Chat models only (embed is not offered), real ones first in catalog order, then simulated ones.
    assert [value for value, _ in options] == ["llama-real", "zz-real", "sim-chat", "fast"]
    assert [text for _, text in options] == [
        "llama-real",
        "zz-real",
        "sim-chat (simulated)",
        "fast (simulated)",
    ]
    assert await page.locator("#model").input_value() == "llama-real"
    await expect(page.locator("#sim-mark")).to_be_hidden()
    await page.select_option("#model", "sim-chat")
    await expect(page.locator("#sim-mark")).to_be_visible()
    await expect(page.locator("#sim-mark")).to_contain_text("simulated")


async def test_a_streamed_answer_says_which_model_and_replica_answered(
    router: RouterServer, page: Page
) -> None:
    await page.goto(router.url + "/")
    await expect(page.locator("#model option")).to_have_count(4)
    await page.fill("#prompt", "tell me a story")
    await page.press("#prompt", "Enter")
    answer = page.locator(".message.assistant").first
    await expect(answer.locator(".meta")).to_have_text("answered by llama-real on replica llama-real-r0")
    text = await answer.locator(".content").text_content()
    assert text and len(text.split()) == 16  # the sim's default max_tokens, streamed word by word

    await page.select_option("#model", "fast")
    await page.fill("#prompt", "and another")
    await page.press("#prompt", "Enter")
    second = page.locator(".message.assistant").nth(1)
    await expect(second.locator(".meta")).to_have_text(
        "answered by sim-chat on replica sim-chat-r0 (simulated output)"
    )


async def test_errors_are_shown_not_swallowed(router: RouterServer, page: Page) -> None:
    await page.goto(router.url + "/")
    await expect(page.locator("#model option")).to_have_count(4)
    await page.select_option("#model", "zz-real")  # no replica: the router answers 503
    await page.fill("#prompt", "hello")
    await page.press("#prompt", "Enter")
    error = page.locator(".message.assistant.error")
    await expect(error).to_contain_text("has no healthy replica")
    # The wait is over: the status no longer says the model is coming.
    await expect(page.locator("#status")).to_have_text("")
    await expect(page.locator("#send")).to_be_enabled()


async def test_a_real_model_that_serves_now_is_preselected_over_one_that_cannot(page: Page) -> None:
    # llama-real has no replica: it would only answer 503. zz-real serves.
    async with _router_serving(("zz-real", False), ("sim-chat", True)) as server:
        await page.goto(server.url + "/")
        await expect(page.locator("#model option")).to_have_count(4)
        assert [value for value, _ in await _options(page)][:2] == ["llama-real", "zz-real"]
        assert await page.locator("#model").input_value() == "zz-real"


def _listed(name: str, state: str, *, simulated: bool = False, guard: bool | None = None) -> dict[str, Any]:
    """A /v1/models entry as the router lists it (``guard``: its ``available``, None: unguarded)."""
    return {
        "id": name,
        "owned_by": "llmgw-sim" if simulated else "llmgw",
        "llmgw": {
            "roles": ["chat"],
            "simulated": simulated,
            "state": state,
            "guard": None if guard is None else {"available": guard, "judges": []},
        },
    }


PRESELECTION = [
    # Serving before anything else; among those serving, real before simulated.
    ([_listed("idle", "no-capacity"), _listed("sim", "serving", simulated=True)], "sim"),
    ([_listed("a", "serving"), _listed("b", "serving"), _listed("sim", "serving", simulated=True)], "a"),
    # Never one whose guard is down (llama-3.1-405b on llmgw dev), even if it serves.
    ([_listed("guarded", "serving", guard=False), _listed("sim", "serving", simulated=True)], "sim"),
    ([_listed("guarded", "serving", guard=True), _listed("sim", "serving", simulated=True)], "guarded"),
    # Loaded on the first request before one that answers 503 at once.
    ([_listed("down", "unavailable"), _listed("lazy", "startable"), _listed("s", "no-capacity")], "lazy"),
    ([_listed("off", "off"), _listed("sim", "startable", simulated=True)], "sim"),
    # A replica starting (loading) likewise: the request waits for it.
    ([_listed("crashed", "no-capacity"), _listed("warming", "loading")], "warming"),
    # Nothing answers: the first of the list still, so the page has a choice.
    ([_listed("down", "unavailable"), _listed("off", "off")], "down"),
    ([_listed("guarded", "serving", guard=False)], "guarded"),
    ([], ""),
]


async def test_the_preselection_order(router: RouterServer, page: Page) -> None:
    await page.goto(router.url + "/")
    await expect(page.locator("#model option")).to_have_count(4)
    # The page's own functions, from the module it runs (imported again, it is the same instance).
    picked = await page.evaluate(
        """async (tables) => {
          const m = await import("/static/chat.js");
          return tables.map((listed) => m.preselected(m.orderModels(listed)));
        }""",
        [listed for listed, _ in PRESELECTION],
    )
    assert picked == [chosen for _, chosen in PRESELECTION]


# llama-real screened by a judge that has no replica.
GUARDED_CATALOG = (
    CATALOG.replace(
        "aliases:\n",
        """  judge:
    roles: [guard]
    profiles: [{engine: vllm, source: org/guard}]
    scaling: {min: 1, max: 1}
aliases:
""",
    )
    + """guard_policies:
  default:
    judge: judge
    models: [llama-real]
"""
)


async def test_a_model_whose_guard_is_down_is_marked_and_not_preselected(page: Page) -> None:
    # llama-real serves, but its judge has no replica: every message would get guard_unavailable.
    async with _router_serving(("llama-real", False), ("sim-chat", True), catalog=GUARDED_CATALOG) as server:
        await page.goto(server.url + "/")
        await expect(page.locator("#model option")).to_have_count(4)
        options = await _options(page)
        assert options[0] == ("llama-real", "llama-real (guard unavailable)")
        assert await page.locator("#model").input_value() == "sim-chat"
        await page.fill("#prompt", "hello")
        await page.click("#send")
        await expect(page.locator(".message.assistant .meta")).to_have_text(
            "answered by sim-chat on replica sim-chat-r0 (simulated output)"
        )
        # Picked by hand, the model says why it does not answer.
        await page.select_option("#model", "llama-real")
        await page.fill("#prompt", "hello again")
        await page.click("#send")
        await expect(page.locator(".message.assistant.error")).to_contain_text("content screen")


@contextlib.asynccontextmanager
async def _llmgw_dev(state_dir: Path) -> AsyncIterator[str]:
    """``llmgw dev`` as a user starts it (the example catalog; ports the OS picks, so runs
    never collide), yielding the chat page's address from its banner once it is up."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llmgw", "dev", "--port", "0", "--admin-port", "0", "--metrics-port", "0",
        "--state-dir", str(state_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=(state_dir.parent / "dev.log").open("w"),
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        banner: list[str] = []
        async with asyncio.timeout(90):
            while not banner or not banner[-1].startswith("Ctrl-C stops everything"):
                line = (await process.stdout.readline()).decode()
                assert line, "llmgw dev exited before its banner:\n" + "".join(banner)
                banner.append(line)
        found = re.search(r"chat page +(http://127\.0\.0\.1:\d+/)", "".join(banner))
        assert found, "".join(banner)
        yield found.group(1)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)  # Ctrl-C: llmgw dev stops every task it started
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


@pytest.mark.e2e
async def test_a_first_run_on_the_example_catalog_answers(tmp_path: Path, page: Page) -> None:
    async with _llmgw_dev(tmp_path / "dev") as chat_page:
        await page.goto(chat_page)
        # Until a model serves, the page says so and reads the list again: as a user, wait for it.
        chosen = page.locator("#model option:checked")
        await expect(chosen).to_have_attribute("data-state", "serving", timeout=120_000)
        await expect(page.locator("#status")).to_have_text("")
        preselected = await page.locator("#model").input_value()
        # llama-3.1-405b serves there, but its fallbacks' judge cannot run: not that one.
        # sim-chat, sim-agent or sim-guarded, whichever serves first: sim-guarded's judge
        # counts as answering while it loads (a request waits for it), so the page need not
        # wait for sim-chat.
        assert preselected in ("sim-chat", "sim-agent", "sim-guarded")

        await page.fill("#prompt", "hello")
        await page.click("#send")
        answer = page.locator(".message.assistant").first
        await expect(answer.locator(".meta")).to_have_text(
            re.compile(rf"^answered by {re.escape(preselected)} on replica \S+ \(simulated output\)$"),
            timeout=30_000,
        )
        await expect(answer).not_to_have_class(re.compile(r"\berror\b"))
        assert (await answer.locator(".content").text_content() or "").strip()

        # The guard demo the README describes: sim-guard lets a normal message through to
        # sim-guarded and blocks its phrase before the model sees it.
        await page.click("#new-chat")
        await page.select_option("#model", "sim-guarded")
        await page.fill("#prompt", "Is the forbidden fruit sweet?")
        await page.click("#send")
        await expect(page.locator(".message.assistant.error")).to_contain_text(
            "rejected by the content policy", timeout=30_000
        )
        await page.fill("#prompt", "hello")
        await page.click("#send")
        await expect(page.locator(".message.assistant").nth(1).locator(".meta")).to_contain_text(
            "answered by sim-guarded", timeout=30_000
        )
