"""Admin settings: where the listener may run, and what it must have there."""

from __future__ import annotations

import argparse

import pytest

from llmgw.admin.settings import (
    DEFAULT_URL,
    AdminSettings,
    AdminSettingsError,
    add_admin_arguments,
    check_settings,
)

TOKEN = "t" * 40


@pytest.mark.parametrize(
    ("settings", "problem", "warning"),
    [
        (AdminSettings(), None, "has no token"),
        (AdminSettings(token=TOKEN), None, None),
        (AdminSettings(host="::1"), None, "has no token"),
        (AdminSettings(token="short"), None, "shorter than 32"),
        (AdminSettings(host="0.0.0.0"), "set LLMGW_ADMIN_TOKEN", None),
        (AdminSettings(host="10.0.0.2", token="short", tls_cert="c", tls_key="k"), "at least 32", None),
        (AdminSettings(host="10.0.0.2", token=TOKEN), "give --admin-tls-cert and --admin-tls-key", None),
        (AdminSettings(host="10.0.0.2", token=TOKEN, tls_cert="c", tls_key="k"), None, None),
        (
            AdminSettings(host="10.0.0.2", token=TOKEN, insecure_plaintext_beyond_loopback=True),
            None,
            "crosses the network in clear text",
        ),
        (AdminSettings(token=TOKEN, tls_cert="c"), "go together", None),
        (AdminSettings(token=TOKEN, port=70000), "--admin-port", None),
        (AdminSettings(token=TOKEN, allowed_hosts=("admin.internal:8081",)), "bare host name", None),
        (AdminSettings(token=TOKEN, apply_attempts=0), "--admin-apply-attempts", None),
    ],
)
def test_check(settings: AdminSettings, problem: str | None, warning: str | None) -> None:
    check = check_settings(settings)
    if problem is None:
        assert check.problems == ()
    else:
        assert any(problem in p for p in check.problems), check.problems
    if warning is None:
        assert check.warnings == ()
    else:
        assert len(check.warnings) == 1 and warning in check.warnings[0], check.warnings


def test_flags_win_over_env_and_the_token_comes_from_env_only() -> None:
    parser = argparse.ArgumentParser()
    add_admin_arguments(parser)
    namespace = parser.parse_args(["--admin-port", "9001", "--admin-allowed-hosts", "A.internal, b.internal"])
    settings = AdminSettings.from_env_and_args(
        {"LLMGW_ADMIN_PORT": "9002", "LLMGW_ADMIN_HOST": "::1", "LLMGW_ADMIN_TOKEN": TOKEN}, namespace
    )
    assert settings.port == 9001
    assert settings.host == "::1"
    assert settings.token == TOKEN
    assert settings.allowed_hosts == ("a.internal", "b.internal")
    assert TOKEN not in repr(settings)
    with pytest.raises(SystemExit):
        parser.parse_args(["--admin-token", TOKEN])


def test_unusable_values_are_named() -> None:
    with pytest.raises(AdminSettingsError, match="LLMGW_ADMIN_PORT='x'"):
        AdminSettings.from_env_and_args({"LLMGW_ADMIN_PORT": "x"})
    with pytest.raises(AdminSettingsError, match="spaces"):
        AdminSettings.from_env_and_args({"LLMGW_ADMIN_TOKEN": TOKEN + "\n"})


def test_urls() -> None:
    assert AdminSettings().url == DEFAULT_URL
    assert AdminSettings(host="::1", port=1, tls_cert="c", tls_key="k").url == "https://[::1]:1"
