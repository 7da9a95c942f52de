"""Test-only scaffolding: fakes of the control plane's ports and the simulated cluster
(``tests.support.control``), the simulated engine's process helpers (``tests.support.sim``)
and a mirror version from bytes in hand (``tests.support.mirror``).

It lives under ``tests/`` so the wheel never ships it; an import-linter contract
(``pyproject.toml``) refuses any ``llmgw`` module that imports it.
"""
