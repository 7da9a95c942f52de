"""The engine security checker, attacked the ways an engine's own parsers would let through."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import Engine, SecurityPolicy, check_profile
from llmgw.core.catalog.security import check_args, check_env


@pytest.mark.parametrize(
    "args",
    [
        ["--trust-remote-code"],
        ["--trust_remote_code"],  # vLLM reads underscores as dashes
        ["--trust-remote"],  # argparse accepts unambiguous prefixes
        ["--trust-remote-code=true"],
        ["--config", "x.yaml"],
        ["--conf=x.yaml"],  # prefix of --config
        ["--port", "1"],  # llmgw owns it
        ["--served-model-name", "other"],
        ["@/etc/llmgw/args"],  # argparse fromfile
    ],
)
def test_vllm_refusals(test_policy: SecurityPolicy, args: list[str]) -> None:
    assert check_args(test_policy, Engine.VLLM, args), args


@pytest.mark.parametrize(
    "args",
    [
        ["--max-model-len", "16384"],
        ["--temperature", "-1"],  # a negative number is a value, not a flag
        ["--dtype", "bfloat16", "--enforce-eager"],
        ["-"],
    ],
)
def test_vllm_accepts_tuning(test_policy: SecurityPolicy, args: list[str]) -> None:
    assert check_args(test_policy, Engine.VLLM, args) == []


def test_llamacpp_has_no_abbreviations_or_underscore_reading(test_policy: SecurityPolicy) -> None:
    # llama.cpp's own parser matches flags exactly, so a prefix is not the flag...
    assert check_args(test_policy, Engine.LLAMACPP, ["--log-fil"]) == []
    # ...but the exact flags and their short forms are refused.
    assert [v.index for v in check_args(test_policy, Engine.LLAMACPP, ["-m", "x", "--log-file=y"])] == [0, 2]


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "PATH",
        "PYTHONWARNINGS",
        "BROWSER",
        "BASH_ENV",
        "HF_TOKEN",
        "NCCL_NET_PLUGIN",
        "CUDA_INJECTION64_PATH",
        "CUDA_VISIBLE_DEVICES",
        "VLLM_PLUGINS",
        "ld_preload",
        "MY_OWN_VAR",
        "NCCL_SOMETHING_PATH",
        "VLLM_API_KEY",
        "1BAD",
        "A=B",
    ],
)
def test_env_refusals(test_policy: SecurityPolicy, name: str) -> None:
    assert check_env(test_policy, Engine.VLLM, {name: "x"}), name


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_DEBUG",
        "VLLM_ATTENTION_BACKEND",
        "OMP_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "PYTORCH_CUDA_ALLOC_CONF",
    ],
)
def test_env_allowed_tuning(test_policy: SecurityPolicy, name: str) -> None:
    assert check_env(test_policy, Engine.VLLM, {name: "x"}) == []


def test_llama_arg_env_is_checked_as_its_flag(test_policy: SecurityPolicy) -> None:
    assert check_env(test_policy, Engine.LLAMACPP, {"LLAMA_ARG_CTX_SIZE": "8192"}) == []
    [refused] = check_env(test_policy, Engine.LLAMACPP, {"LLAMA_ARG_LOG_FILE": "/tmp/x"})
    assert "llama.cpp reads it as --log-file" in refused.reason
    [unknown] = check_env(test_policy, Engine.LLAMACPP, {"LLAMA_ARG_SOMETHING_NEW": "1"})
    assert "has not reviewed" in unknown.reason
    assert check_env(test_policy, Engine.VLLM, {"LLAMA_ARG_CTX_SIZE": "1"})


def test_check_profile_reports_args_and_env_together(test_policy: SecurityPolicy) -> None:
    violations = check_profile(test_policy, Engine.VLLM, ["--trust-remote-code"], {"LD_PRELOAD": "x"})
    assert [v.message.split(" is refused")[0] for v in violations] == [
        "argument --trust-remote-code",
        "environment variable LD_PRELOAD",
    ]
