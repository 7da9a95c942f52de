"""The shipped policies/engine-security.yaml, attacked with what each engine's parser would accept."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from llmgw.core.catalog import Engine, SecurityPolicy
from llmgw.core.catalog.security import check_args, check_env

REFUSED_ARGS = [
    # code execution
    (Engine.VLLM, ["--trust-remote-code"]),
    (Engine.VLLM, ["--trust_remote_code"]),
    (Engine.VLLM, ["--trust-rem"]),
    (Engine.VLLM, ["--trust-remote-code=True"]),
    (Engine.VLLM, ["--tool-parser-plugin", "/tmp/x.py"]),
    (Engine.VLLM, ["--middleware", "evil.mod"]),
    (Engine.VLLM, ["--worker-extension-cls", "evil.Cls"]),
    (Engine.VLLM, ["--speculative-config.model", "/etc/shadow"]),  # dotted sub-key
    (Engine.VLLM, ["-cc.backend=evil.fn"]),  # a single-dash flag's dotted sub-key is the flag too
    (Engine.VLLM, ["-cc.backend", "evil.fn"]),
    (Engine.VLLM, ["-c.backend", "evil.fn"]),  # -c, then argparse reads it as -cc
    (Engine.VLLM, ["-dpa.x", "10.0.0.1"]),
    (Engine.VLLM, ['-O{"backend": "evil.fn"}']),  # short flag with attached value
    (Engine.VLLM, ["--allowed-local-media-path", "/"]),
    (Engine.VLLM, ["--config", "/tmp/args.yaml"]),
    (Engine.VLLM, ["@/tmp/args"]),
    # argparse reads an unambiguous prefix of a single-dash option as that option
    (Engine.VLLM, ["-c", '{"backend": "evil.fn"}']),  # -cc, --compilation-config
    (Engine.VLLM, ['-c={"backend": "evil.fn"}']),  # the same, as Python 3.12+ reads it
    (Engine.VLLM, ["-t", "8"]),  # -tp, which llmgw sets
    (Engine.VLLM, ["-dpb", "ray"]),
    (Engine.SGLANG, ["--trust-remote-code"]),
    (Engine.SGLANG, ["--enable-custom-logit-processor"]),
    (Engine.SGLANG, ["--tokenizer-path", "/tmp/t"]),
    (Engine.LLAMACPP, ["--log-file", "/etc/cron.d/x"]),
    (Engine.LLAMACPP, ["--slot-save-path", "/root"]),
    (Engine.LLAMACPP, ["--rpc", "10.0.0.1:50052"]),
    (Engine.LLAMACPP, ["-m", "/etc/passwd"]),
    (Engine.LLAMACPP, ["--path", "/"]),
    # found against the pinned engines' parsers (issue 16)
    (Engine.SGLANG, ["--oltp-traces-endpoint", "10.0.0.1:4317"]),  # SGLang 0.5.3's real spelling
    (Engine.SGLANG, ["--enable-trace"]),  # exports to localhost:4317 by default
    (Engine.SGLANG, ["--ds-channel-config-path", "/etc/x.json"]),
    (Engine.SGLANG, ["--debug-tensor-dump-inject", "1"]),
    (Engine.SGLANG, ["--chat-template", "/etc/passwd"]),
    (Engine.SGLANG, ["--chat-template=./t.jinja"]),
    (Engine.SGLANG, ["--chat-temp", "/tmp/t.json"]),  # an abbreviation, as argparse reads it
    (Engine.SGLANG, ["--completion-template", "/tmp/c.json"]),
    (Engine.LLAMACPP, ["--embd-bge-small-en-default"]),  # sets a Hub repo: downloads another model
    (Engine.LLAMACPP, ["--embd-e5-small-en-default"]),
    (Engine.LLAMACPP, ["--embd-gte-small-default"]),
    (Engine.VLLM, ["--api-server-count", "0"]),  # the same as --headless
    (Engine.VLLM, ["-asc", "0"]),
    (Engine.VLLM, ["--api-server-count=0"]),
    (Engine.VLLM, ["-asc=0"]),
    (Engine.VLLM, ["--api_server_count", "00"]),
    (Engine.VLLM, ["--api-server", "0"]),
    (Engine.VLLM, ["--generation-config", "/etc"]),
    (Engine.VLLM, ["--generation-config=/root/x"]),
    # what llmgw sets itself
    (Engine.VLLM, ["--port", "1"]),
    (Engine.VLLM, ["--host=0.0.0.0"]),
    (Engine.VLLM, ["--served-model-name", "gpt-4"]),
    (Engine.VLLM, ["--tensor-parallel-size", "8"]),
    (Engine.SGLANG, ["--dist-init-addr", "10.0.0.1:5000"]),
    (Engine.LLAMACPP, ["--host", "0.0.0.0"]),
    (Engine.SIM, ["--port", "1"]),
    (Engine.SIM, ["--head-file", "/etc/passwd"]),
]

ALLOWED_ARGS = [
    (Engine.VLLM, ["--max-model-len", "16384", "--gpu-memory-utilization", "0.9"]),
    (Engine.VLLM, ["--enable-prefix-caching", "--enforce-eager"]),
    (Engine.VLLM, ["--reasoning-parser", "deepseek_r1"]),  # a real option, though a prefix of a refused one
    (Engine.VLLM, ["--data-parallel-size", "2"]),
    (Engine.VLLM, ["-dp", "2"]),  # a real option, though a prefix of -dpa, -dpp...
    (Engine.SGLANG, ["--quantization", "fp8"]),
    (Engine.SGLANG, ["--mem-fraction-static", "0.85"]),
    (Engine.LLAMACPP, ["--ctx-size", "8192", "--n-gpu-layers", "999"]),
    # values that read no file and open nothing (issue 16)
    (Engine.VLLM, ["--generation-config", "vllm"]),
    (Engine.VLLM, ["--generation-config=auto"]),
    (Engine.VLLM, ["--api-server-count", "2"]),
    (Engine.VLLM, ["-asc", "4"]),
    (Engine.SGLANG, ["--chat-template", "chatml"]),  # a built-in template name
    (Engine.SGLANG, ["--chat-template=llama-2"]),
    (Engine.SGLANG, ["--completion-template", "qwen_coder"]),
    (Engine.SIM, ["--crash-after", "3"]),
]

REFUSED_ENV = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "PATH",
    "PYTHONPATH",
    "PYTHONWARNINGS",
    "PYTHONSTARTUP",
    "BROWSER",
    "BASH_ENV",
    "ENV",
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HUGGING_FACE_HUB_TOKEN",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "CUDA_INJECTION64_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "VLLM_PLUGINS",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "VLLM_LOGGING_CONFIG_PATH",
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
    "GGML_BACKEND_PATH",
    "SGL_ANYTHING",
    "NCCL_DEBUG_FILE",
    "VLLM_API_KEY",
    "RAY_ADDRESS",
    "AWS_SECRET_ACCESS_KEY",
    "http_proxy",
    "HTTPS_PROXY",
]

ALLOWED_ENV = [
    "NCCL_DEBUG",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "VLLM_ATTENTION_BACKEND",
    "OMP_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TOKENIZERS_PARALLELISM",
]


@pytest.mark.parametrize(("engine", "args"), REFUSED_ARGS, ids=[f"{e}:{a[0][:30]}" for e, a in REFUSED_ARGS])
def test_refused_args(shipped_policy: SecurityPolicy, engine: Engine, args: list[str]) -> None:
    violations = check_args(shipped_policy, engine, args)
    assert [v.index for v in violations] == [0], violations


@pytest.mark.parametrize(("engine", "args"), ALLOWED_ARGS, ids=[f"{e}:{a[0]}" for e, a in ALLOWED_ARGS])
def test_allowed_args(shipped_policy: SecurityPolicy, engine: Engine, args: list[str]) -> None:
    assert check_args(shipped_policy, engine, args) == []


@pytest.mark.parametrize("name", REFUSED_ENV)
def test_refused_env(shipped_policy: SecurityPolicy, name: str) -> None:
    for engine in Engine:
        assert check_env(shipped_policy, engine, {name: "x"}), (engine, name)


@pytest.mark.parametrize("name", ALLOWED_ENV)
def test_allowed_env(shipped_policy: SecurityPolicy, name: str) -> None:
    assert check_env(shipped_policy, Engine.VLLM, {name: "x"}) == []


def test_llama_arg_env_is_judged_as_its_flag(shipped_policy: SecurityPolicy) -> None:
    assert check_env(shipped_policy, Engine.LLAMACPP, {"LLAMA_ARG_CTX_SIZE": "8192"}) == []
    assert check_env(shipped_policy, Engine.LLAMACPP, {"LLAMA_ARG_NO_HOST": "1"}) == []
    [refused] = check_env(shipped_policy, Engine.LLAMACPP, {"LLAMA_ARG_MODEL": "/etc/passwd"})
    assert "llama.cpp reads it as" in refused.reason
    [unreviewed] = check_env(shipped_policy, Engine.LLAMACPP, {"LLAMA_ARG_NOT_A_REAL_FLAG": "1"})
    assert "has not reviewed" in unreviewed.reason


def test_every_engine_has_an_args_section(shipped_policy: SecurityPolicy) -> None:
    assert set(shipped_policy.args) == set(Engine)


# vLLM's single-dash options that the policy neither refuses nor lists as exact.
_VLLM_OTHER_SHORT_OPTIONS = ("-asc", "-dcp", "-pcp", "-ep", "-ac", "-q")


def _parser_like(policy: SecurityPolicy, engine: Engine) -> argparse.ArgumentParser:
    """An argparse parser with the engine's refused and real option strings, each its own dest."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=True, exit_on_error=False)
    section = policy.args[engine]
    others = _VLLM_OTHER_SHORT_OPTIONS if engine is Engine.VLLM else ()
    for option in {*section.deny, *section.owned, *section.exact_options, *others}:
        parser.add_argument(option, dest=option, nargs="?", default=None, const="")
    return parser


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG, Engine.SIM])
def test_whatever_argparse_reads_as_a_refused_option_is_refused(
    shipped_policy: SecurityPolicy, engine: Engine
) -> None:
    """Every prefix of every refused option, with and without an attached value, fed to a
    real argparse parser: when it lands on a refused option, the checker refuses it too."""
    section = shipped_policy.args[engine]
    refused = {*section.deny, *section.owned}
    parser = _parser_like(shipped_policy, engine)
    candidates = {
        option[:end] + suffix
        for option in refused
        for end in range(2, len(option) + 1)
        for suffix in ("", "=x", "x")
    }
    tried = 0
    for candidate in sorted(candidates):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parsed = vars(parser.parse_args([candidate]))
        except (SystemExit, argparse.ArgumentError):
            continue  # ambiguous or unknown: the engine would refuse to start
        landed = {dest for dest, value in parsed.items() if value is not None}
        if landed & refused:
            tried += 1
            assert check_args(shipped_policy, engine, [candidate]), (candidate, landed)
    assert tried > len(refused)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_whatever_argparse_reads_as_a_value_ruled_option_gets_its_value_checked(
    shipped_policy: SecurityPolicy, engine: Engine
) -> None:
    """A flag allowed only with reviewed values, spelt any way argparse reads it, with a
    path for a value: refused whenever the parser lands on that flag."""
    section = shipped_policy.args[engine]
    parser = _parser_like(shipped_policy, engine)
    for option in set(section.values) - set(parser._option_string_actions):
        parser.add_argument(option, dest=option, nargs="?", default=None, const="")
    tried = 0
    for option in section.values:
        for end in range(2, len(option) + 1):
            for words in ([option[:end], "/etc/passwd"], [option[:end] + "=/etc/passwd"]):
                try:
                    with contextlib.redirect_stderr(io.StringIO()):
                        parsed = vars(parser.parse_args(words))
                except (SystemExit, argparse.ArgumentError):
                    continue
                if parsed.get(option) == "/etc/passwd":
                    tried += 1
                    assert check_args(shipped_policy, engine, words), (words, option)
    assert tried > len(section.values)
