"""``llmgw ctl`` against an admin API started here on the Consul stand-in.

The CI-style tests run ``llmgw ctl`` as a real process (what a pipeline runs); the rest
call the same entry point in a worker thread to keep the suite fast.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llmgw.adapters.redis.limits import BudgetHold, RedisLimitStore
from llmgw.admin import AdminListener, RenderedSpecHashes
from llmgw.cli import main
from llmgw.cli.ctl_cmd import print_diff
from llmgw.cli.output import format_when
from llmgw.core.budgets import budget_window
from llmgw.core.catalog import Catalog, SecurityPolicy, load_catalog
from llmgw.core.catalog_diff import catalog_diff, diff_from_dict, diff_to_dict
from llmgw.core.planning.status import ModelStatus, StatusReport, to_json
from llmgw.core.records import catalog_sha256
from llmgw.render import Renderer, RenderSettings
from tests.support.redis_server import MISSING, REDIS_SERVER, RedisServer

if TYPE_CHECKING:
    from conftest import RecordedModelCommands, StartAdmin, Stores, Texts


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def ctl_env(admin: AdminListener, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["LLMGW_ADMIN_URL"] = admin.url
    if token is not None:
        env["LLMGW_ADMIN_TOKEN"] = token
    return env


async def run_process(args: list[str], env: dict[str, str], cwd: Path) -> Ran:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw",
        *args,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


class Terminal(io.StringIO):
    """Standard input that says it is a terminal, with the operator's answers in it."""

    def isatty(self) -> bool:
        return True


CtlRunner = Callable[..., Awaitable[Ran]]


@pytest.fixture
def ctl(
    admin: AdminListener, texts: Texts, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> CtlRunner:
    """``await ctl(*args)``: ``llmgw ctl ARGS`` in a worker thread, its exit code and output."""
    monkeypatch.setenv("LLMGW_ADMIN_URL", admin.url)
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", texts.token)
    monkeypatch.delenv("LLMGW_ACTOR", raising=False)

    async def run(*args: str, stdin: str = "", tty: bool = False) -> Ran:
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdin", Terminal(stdin) if tty else io.StringIO(stdin))
        code = await asyncio.to_thread(main, ["ctl", *args])
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


def expected_diff(old: str | None, new: str, policy: SecurityPolicy) -> dict[str, object]:
    def load(text: str) -> Catalog:
        result = load_catalog(text, filename="x", policy=policy)
        assert result.catalog is not None
        return result.catalog

    hashes = RenderedSpecHashes(Renderer(RenderSettings(), policy))
    return diff_to_dict(catalog_diff(load(old) if old else None, load(new), hashes))


# --- CI: real processes ---------------------------------------------------------------------------


async def test_ci_apply_of_a_bad_catalog_prints_the_checks_lines_and_changes_nothing(
    admin: AdminListener, stores: Stores, texts: Texts, tmp_path: Path
) -> None:
    (tmp_path / "catalog.yaml").write_text(texts.bad)
    env = ctl_env(admin, texts.token)
    applied = await run_process(["ctl", "apply", "catalog.yaml", "--yes"], env, tmp_path)
    checked = await run_process(["catalog", "check", "catalog.yaml"], env, tmp_path)
    assert applied.code == 1 and checked.code == 1
    assert applied.lines == checked.lines
    assert applied.lines[0].startswith("catalog.yaml:")
    assert any("--trust-remote-code" in line for line in applied.lines)
    assert "error(s)" in applied.err
    assert await stores.catalogs.current() is None


async def test_ci_apply_of_a_good_catalog_prints_the_diff_catalog_diff_computes(
    admin: AdminListener, stores: Stores, texts: Texts, tmp_path: Path, shipped_policy: SecurityPolicy
) -> None:
    env = {**ctl_env(admin, texts.token), "LLMGW_ACTOR": "ci"}
    (tmp_path / "catalog.yaml").write_text(texts.good)
    first = await run_process(["ctl", "apply", "catalog.yaml", "--yes", "--json"], env, tmp_path)
    assert first.code == 0, first.err
    answer = json.loads(first.out)
    assert answer["applied"] is True and answer["version"] == 1
    assert answer["diff"] == expected_diff(None, texts.good, shipped_policy)

    (tmp_path / "catalog.yaml").write_text(texts.next)
    second = await run_process(["ctl", "apply", "catalog.yaml", "--yes"], env, tmp_path)
    assert second.code == 0, second.err
    shown = io.StringIO()
    print_diff(diff_from_dict(expected_diff(texts.good, texts.next, shipped_policy)), shown)
    table = shown.getvalue().splitlines()
    assert [line for line in second.lines if line in table] == table
    assert any(line.split()[:2] == ["roll", "chat"] for line in second.lines)
    assert second.lines[-1].startswith("applied: catalog version 2")
    current = await stores.catalogs.current()
    assert current is not None and current.text == texts.next and current.applied_by == "ci via admin-token"


async def test_ci_unreachable_admin_api_exits_3(tmp_path: Path, texts: Texts) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before ctl connects
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["LLMGW_ADMIN_URL"] = f"http://127.0.0.1:{port}"
    (tmp_path / "catalog.yaml").write_text(texts.good)
    ran = await run_process(["ctl", "apply", "catalog.yaml", "--yes"], env, tmp_path)
    assert ran.code == 3
    assert "cannot reach the admin API" in ran.err


# --- the other commands, in-process ---------------------------------------------------------------


async def test_diff_get_history(ctl: CtlRunner, stores: Stores, texts: Texts, tmp_path: Path) -> None:
    good, nxt = tmp_path / "good.yaml", tmp_path / "next.yaml"
    good.write_text(texts.good)
    nxt.write_text(texts.next)
    assert (await ctl("apply", str(good), "--yes", "--actor", "alice")).code == 0
    diff = await ctl("diff", str(nxt))
    assert diff.code == 0
    assert diff.lines[0].startswith("Against catalog version 1")
    assert "roll" in diff.out and "fresh" in diff.out
    current = await stores.catalogs.current()
    assert current is not None and current.version == 1

    got = await ctl("catalog", "get")
    assert got.code == 0 and got.out == texts.good
    assert f"sha256 {catalog_sha256(texts.good)}" in got.err
    history = await ctl("catalog", "history")
    assert history.lines[0].split() == ["VERSION", "APPLIED", "AT", "APPLIED", "BY", "SHA256"]
    assert history.lines[1].split()[0] == "1" and "alice via admin-token" in history.lines[1]


async def test_a_hostile_catalogs_diagnostics_reach_the_terminal_escaped(
    ctl: CtlRunner, stores: Stores, tmp_path: Path
) -> None:
    # The admin API answers with the exact strings (JSON); ctl prints them as `catalog check`
    # does, every control character (ESC, BEL, C1, DEL, U+202E) written as its escape.
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(
        'models:\n  m:\n    profiles: [{engine: "sim\\e[2J", "\\e]0;pwned\\a": 1}]\n'
        '  "gpt\u202eexe\\x9b\\x7f": {profiles: [{engine: sim}]}\n',
        encoding="utf-8",
    )
    for command in ("diff", "apply"):
        ran = (
            await ctl(command, str(hostile), "--yes")
            if command == "apply"
            else await ctl(command, str(hostile))
        )
        assert ran.code == 1
        shown = ran.out + ran.err
        assert {char for char in shown if not char.isprintable() and char != "\n"} == set()
        assert "\\x1b]0;pwned\\x07" in ran.out
        assert "sim\\x1b[2J" in ran.out
        assert "gpt\\u202eexe\\x9b\\x7f" in ran.out
    assert await stores.catalogs.current() is None


async def test_apply_asks_on_a_terminal_and_refuses_without_one(
    ctl: CtlRunner, stores: Stores, texts: Texts, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(texts.good)
    no_tty = await ctl("apply", str(path))
    assert no_tty.code == 2 and "--yes" in no_tty.err
    declined = await ctl("apply", str(path), stdin="n\n", tty=True)
    assert declined.code == 1 and "not applied" in declined.err
    assert await stores.catalogs.current() is None
    accepted = await ctl("apply", str(path), stdin="y\n", tty=True)
    assert accepted.code == 0 and "applied: catalog version 1" in accepted.out


async def test_apply_is_refused_when_the_catalog_moved_since_the_diff(
    ctl: CtlRunner, stores: Stores, texts: Texts, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(texts.good)
    assert (await ctl("apply", str(path), "--yes")).code == 0
    path.write_text(texts.next)
    stale = await ctl("apply", str(path), "--yes", "--if-match", "0" * 64)
    assert stale.code == 1
    assert "version 1" in stale.err and "llmgw ctl diff" in stale.err
    current = await stores.catalogs.current()
    assert current is not None and current.text == texts.good


async def test_keys(ctl: CtlRunner, stores: Stores) -> None:
    created = await ctl("keys", "create", "team-a", "--model", "chat", "--requests-per-minute", "10")
    assert created.code == 0
    secret = created.out.strip()
    assert secret.startswith("sk-llmgw-") and "shown once" in created.err
    (key_id,) = list(await stores.keys.list())
    listed = await ctl("keys", "list")
    assert listed.lines[0].split()[:3] == ["ID", "NAME", "MODELS"]
    assert listed.lines[1].split()[:5] == [key_id, "team-a", "chat", "10", "-"]
    assert secret not in listed.out
    as_json = json.loads((await ctl("keys", "list", "--json")).out)
    assert as_json["keys"][0]["id"] == key_id
    assert (await ctl("keys", "revoke", key_id)).code == 0
    assert (await stores.keys.list())[key_id].revoked
    missing = await ctl("keys", "revoke", "k-0000000000000000")
    assert missing.code == 1 and "no API key" in missing.err


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RedisLimitStore]:
    """The routers' shared limits and usage, on a real redis-server (its tests skip without one)."""
    redis = RedisServer(tmp_path / "redis")
    await redis.start()
    limits = RedisLimitStore(redis.url)
    try:
        yield limits
    finally:
        await limits.close()
        await redis.stop()


@pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)
async def test_keys_usage_prints_what_the_routers_counted(
    ctl: CtlRunner, stores: Stores, start: StartAdmin, monkeypatch: pytest.MonkeyPatch, store: RedisLimitStore
) -> None:
    key_id = (await stores.keys.create("team-a")).record.key_id
    await store.count_usage(key_id, "chat", {"requests": 3, "input_tokens": 40, "output_tokens": 7})
    monkeypatch.setenv("LLMGW_ADMIN_URL", (await start(stores, usage=store)).url)
    shown = await ctl("keys", "usage", key_id)
    assert shown.code == 0
    assert shown.lines[0] == f"API key {key_id} (team-a)"
    assert shown.lines[1].split() == ["MODEL", "REQUESTS", "INPUT", "OUTPUT", "CACHED"]
    assert shown.lines[2].split() == ["chat", "3", "40", "7", "0"]
    as_json = json.loads((await ctl("keys", "usage", key_id, "--json")).out)
    assert as_json["usage"][0]["input_tokens"] == 40


@pytest.mark.skipif(REDIS_SERVER is None, reason=MISSING)
async def test_keys_create_with_a_budget_and_usage_shows_the_period_used_and_left(
    ctl: CtlRunner, stores: Stores, start: StartAdmin, monkeypatch: pytest.MonkeyPatch, store: RedisLimitStore
) -> None:
    monkeypatch.setenv("LLMGW_ADMIN_URL", (await start(stores, usage=store)).url)
    created = await ctl(
        "keys", "create", "team-a", "--token-budget", "5000", "--budget-period", "daily", "--json"
    )
    assert created.code == 0, created.err
    key = json.loads(created.out)["key"]
    assert (key["token_budget"], key["budget_period"]) == (5000, "daily")
    listed = await ctl("keys", "list")
    assert "5000/daily" in listed.out.splitlines()[1].split()
    record = (await stores.keys.list())[key["id"]]
    period = record.budget
    assert period is not None
    window = budget_window(period, record.created_at, time.time())
    assert window.end is not None
    held = BudgetHold(5000, window.start, window.end, 1000, 86400)
    admitted = await store.admit(
        key["id"], "r", "h1", requests_per_minute=None, tokens_per_minute=None, tokens=0, unbounded=False,
        budget=held,
    )  # fmt: skip
    assert admitted.admitted
    await store.settle(key["id"], "r", "h1", tokens_per_minute=None, held=0, used=1234, budget=held)
    shown = await ctl("keys", "usage", key["id"])
    assert shown.code == 0
    assert shown.lines[-1].startswith("budget: 1234 of 5000 tokens used this period (daily, since ")
    assert shown.lines[-1].endswith(f"3766 left; resets at {format_when(window.end)}")
    as_json = json.loads((await ctl("keys", "usage", key["id"], "--json")).out)
    assert as_json["budget"] == {
        "tokens": 5000, "period": "daily", "period_start": window.start, "resets_at": window.end,
        "used": 1234, "left": 3766,
    }  # fmt: skip
    raised = await ctl("keys", "budget", key["id"], "--token-budget", "8000")
    assert raised.code == 0 and raised.out.strip().endswith("token budget 8000/daily")  # its period kept
    left = json.loads((await ctl("keys", "usage", key["id"], "--json")).out)["budget"]["left"]
    assert left == 8000 - 1234  # the period's usage stays counted
    removed = await ctl("keys", "budget", key["id"], "--none")
    assert removed.code == 0 and removed.out.strip().endswith("token budget removed")
    with pytest.raises(SystemExit) as usage_error:  # one of --token-budget, --none
        await ctl("keys", "budget", key["id"])
    assert usage_error.value.code == 2
    refused = await ctl("keys", "create", "team-b", "--token-budget", "-1")
    assert refused.code == 1 and "token budget" in refused.err
    bad_period = await ctl("keys", "create", "team-b", "--token-budget", "10", "--budget-period", "soon")
    assert bad_period.code == 1 and "daily, weekly, monthly" in bad_period.err


async def test_drain_restart_and_status(
    ctl: CtlRunner, stores: Stores, models: RecordedModelCommands
) -> None:
    drained = await ctl("drain", "chat")
    assert drained.code == 0 and drained.out.startswith("chat: drain started")
    assert (await ctl("restart", "org/model")).code == 0
    assert (await ctl("drain", "nope")).code == 1
    assert models.calls == [
        ("drain", "chat", "ctl via admin-token"),
        ("restart", "org/model", "ctl via admin-token"),
    ]

    none_yet = await ctl("status")
    assert none_yet.code == 3 and "no status has been published" in none_yet.err
    report = StatusReport(
        generated_at=1_700_000_000.0,
        catalog_hash="ab" * 32,
        leader="cp-1",
        models=(
            ModelStatus(
                "chat", "keep-running", 1, 0, (), "min 1", "no node has 2 free GPUs of any model", None
            ),
        ),
    )
    await stores.status.publish(to_json(report))
    status = await ctl("status")
    assert status.code == 0
    assert status.lines[0].startswith("leader cp-1")
    assert status.lines[3].split()[:4] == ["chat", "keep-running", "1", "0"]
    assert "no node has 2 free GPUs" in status.out


async def test_a_wrong_token_or_a_bad_url_say_what_to_do(
    ctl: CtlRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_ADMIN_TOKEN", "not-the-token-not-the-token-not-the")
    refused = await ctl("keys", "list")
    assert refused.code == 1 and "LLMGW_ADMIN_TOKEN" in refused.err
    bad_url = await ctl("keys", "list", "--admin-url", "ftp://x")
    assert bad_url.code == 2
    unreadable = await ctl("diff", "/nonexistent/catalog.yaml")
    assert unreadable.code == 2 and "cannot read" in unreadable.err


def test_the_admin_token_is_never_in_a_connections_repr() -> None:
    import argparse

    from llmgw.cli.ctl_cmd import Connection

    token = "s3cret-admin-token-0123456789abcdef"
    connection = Connection.of(argparse.Namespace(), {"LLMGW_ADMIN_TOKEN": token})
    assert connection.token == token
    assert token not in repr(connection) and token not in str(connection)


async def test_status_of_one_model(ctl: CtlRunner, stores: Stores) -> None:
    report = StatusReport(
        generated_at=1_700_000_000.0,
        catalog_hash="ab" * 32,
        leader="cp-1",
        models=(
            ModelStatus("chat", "keep-running", 1, 0, (), "min 1", "no node has 2 free GPUs", None),
            ModelStatus("lazy", "on-demand", 0, 0, (), "idle", "", None),
        ),
    )
    await stores.status.publish(to_json(report))
    one = await ctl("status", "--model", "lazy")
    assert one.code == 0, one.err
    assert [line.split()[0] for line in one.lines[3:]] == ["lazy"]
    as_json = json.loads((await ctl("status", "--model", "chat", "--json")).out)
    assert [m["model"] for m in as_json["models"]] == ["chat"] and as_json["leader"] == "cp-1"
    unknown = await ctl("status", "--model", "nope")
    assert unknown.code == 1
    assert unknown.err == "llmgw ctl: no model 'nope' in the status (models: chat, lazy)\n"


async def test_a_key_for_a_model_the_catalog_lacks_is_created_with_a_warning(
    ctl: CtlRunner, stores: Stores, texts: Texts, tmp_path: Path
) -> None:
    before_any = await ctl("keys", "create", "early", "--model", "chat")
    assert before_any.code == 0 and before_any.out.startswith("sk-llmgw-")
    assert "warning: 'chat': no catalog has been applied yet" in before_any.err
    good = tmp_path / "good.yaml"
    good.write_text(texts.good)
    assert (await ctl("apply", str(good), "--yes")).code == 0
    known = await ctl("keys", "create", "team-a", "--model", "chat", "--model", "gpt")  # a model, an alias
    assert known.code == 0 and "warning" not in known.err
    typo = await ctl("keys", "create", "team-b", "--model", "chat", "--model", "nope", "--json")
    assert typo.code == 0 and json.loads(typo.out)["key"]["models"] == ["chat", "nope"]
    assert typo.err == (
        "llmgw ctl: warning: 'nope': the applied catalog (version 1) has no such model or alias; "
        "the key allows it once a catalog serving it is applied (check the spelling)\n"
    )
    assert len(await stores.keys.list()) == 3


async def test_the_routers_port_by_mistake_gets_a_hint(ctl: CtlRunner) -> None:
    from aiohttp import web

    from llmgw.gateway.errors import not_found_url, response_for

    async def router_404(request: web.Request) -> web.Response:
        return response_for(not_found_url(request.method, request.path))  # the router's own answer

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", router_404)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        wrong = await ctl("--admin-url", f"http://127.0.0.1:{port}", "status")
    finally:
        await runner.cleanup()
    assert wrong.code == 1
    assert wrong.err == (
        "llmgw ctl: Invalid URL (GET /admin/v1/status) (is this llmgw's admin API? the router listens "
        "on 8080, the admin API on 8081 by default: see --admin-url and $LLMGW_ADMIN_URL)\n"
    )
    # The admin API's own 404s need no such hint.
    no_catalog = await ctl("catalog", "get")
    assert no_catalog.code == 1 and "is this llmgw's admin API" not in no_catalog.err


def test_a_subcommands_usage_errors_show_its_own_usage(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, usage in (
        (["ctl", "status", "--bogus"], "usage: llmgw ctl status"),
        (["ctl", "status", "--actor", "ci"], "usage: llmgw ctl status"),  # read-only: no audit trail
        (["ctl", "catalog", "get", "--actor", "ci"], "usage: llmgw ctl catalog get"),
        (["catalog", "check", "x.yaml", "--bogus"], "usage: llmgw catalog check"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2
        assert err.startswith(usage), err
        assert f"error: unrecognized arguments: {argv[-2] if argv[-2] == '--actor' else argv[-1]}" in err
