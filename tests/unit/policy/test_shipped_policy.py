"""The shipped policies/engine-security.yaml, attacked with what each engine's parser would accept."""

from __future__ import annotations

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
    (Engine.VLLM, ['-O{"backend": "evil.fn"}']),  # short flag with attached value
    (Engine.VLLM, ["--allowed-local-media-path", "/"]),
    (Engine.VLLM, ["--config", "/tmp/args.yaml"]),
    (Engine.VLLM, ["@/tmp/args"]),
    (Engine.SGLANG, ["--trust-remote-code"]),
    (Engine.SGLANG, ["--enable-custom-logit-processor"]),
    (Engine.SGLANG, ["--tokenizer-path", "/tmp/t"]),
    (Engine.LLAMACPP, ["--log-file", "/etc/cron.d/x"]),
    (Engine.LLAMACPP, ["--slot-save-path", "/root"]),
    (Engine.LLAMACPP, ["--rpc", "10.0.0.1:50052"]),
    (Engine.LLAMACPP, ["-m", "/etc/passwd"]),
    (Engine.LLAMACPP, ["--path", "/"]),
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
    (Engine.SGLANG, ["--quantization", "fp8"]),
    (Engine.SGLANG, ["--mem-fraction-static", "0.85"]),
    (Engine.LLAMACPP, ["--ctx-size", "8192", "--n-gpu-layers", "999"]),
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
