"""The Hugging Face token: where it is read from, and how it is kept out of every output.

Owns reading the token the standard way (``HF_TOKEN``, then
``HUGGING_FACE_HUB_TOKEN``, then the file at ``HF_TOKEN_PATH`` or
``$HF_HOME/token``, default ``~/.cache/huggingface/token``) and the ``HubToken``
wrapper whose ``repr``/``str`` never show the value. The only way to the value
is ``authorization_header()``, used only for requests to the Hub's own origin.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

_MASK = "***"


class HubToken:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def __repr__(self) -> str:
        return f"HubToken({_MASK})"

    __str__ = __repr__

    def authorization_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._value}"}

    def redact(self, text: str) -> str:
        """``text`` with every occurrence of the token masked: a last line of defence before printing."""
        return text.replace(self._value, _MASK) if self._value else text


def token_file(env: Mapping[str, str], home: Path) -> Path:
    if env.get("HF_TOKEN_PATH"):
        return Path(env["HF_TOKEN_PATH"])
    hf_home = Path(env["HF_HOME"]) if env.get("HF_HOME") else home / ".cache" / "huggingface"
    return hf_home / "token"


def read_hub_token(env: Mapping[str, str], home: Path) -> HubToken | None:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = env.get(name, "").strip()
        if value:
            return HubToken(value)
    path = token_file(env, home)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    return HubToken(value) if value else None
