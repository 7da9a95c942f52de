"""The mirror's error types: each message says what failed and what to do next.

Owns the exception classes the mirror's I/O raises. Messages never carry a
credential: they are built from URLs without query strings, file paths and
status codes only.
"""

from __future__ import annotations


class MirrorError(Exception):
    """A mirror operation that failed; ``str(exc)`` is fit to print to the user."""


class HubError(MirrorError):
    """The Hub refused or failed a listing or a download."""


class DownloadFailed(MirrorError):
    """A file could not be fetched after the allowed retries."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(f"{label}: {reason}")
        self.label = label


class ChecksumMismatch(DownloadFailed):
    """A file's bytes do not hash to what the Hub or the manifest promised; the file was deleted."""

    def __init__(self, label: str, expected: str, actual: str) -> None:
        super().__init__(label, f"sha256 mismatch (expected {expected}, got {actual}); the file was deleted")
        self.expected = expected
        self.actual = actual


class VersionBusy(MirrorError):
    """Another process holds the version (a ``mirror add`` downloading it)."""


class VersionConflict(MirrorError):
    """``mirror add`` was asked to put different content under an existing version."""
