"""The model mirror (``llmgw mirror``): fetch a model once, verify every byte, serve it to the nodes.

Public face; the modules behind it:

- ``adding``     ``mirror add``: plan a version, download it, publish its manifest when complete
- ``hub``        the Hugging Face Hub API (resolve a revision, list files)
- ``transfer``   resumable, throttled, verifying downloads (shared by ``add`` and ``fetch``)
- ``store``      the directory store and its layout; ``s3store`` the same read from a bucket
- ``server``     the aiohttp app serving the index, manifests and files
- ``fetching``   ``mirror fetch``: the node-side prestart fetch-and-verify
- ``indexing``   ``load_index`` for ``llmgw catalog check``
- ``collecting`` ``mirror gc``

The decisions (what to select, when a version is complete, what gc deletes) are
in ``llmgw.core.mirror``; see DESIGN.md beside this file.
"""

# The errors only: every command's parser is built at start-up, and importing the
# modules behind them (aiohttp, rich) here would cost every `llmgw` command half a
# second. Import those from their own modules.
from llmgw.mirror.errors import ChecksumMismatch, DownloadFailed, HubError, MirrorError

__all__ = ["ChecksumMismatch", "DownloadFailed", "HubError", "MirrorError"]
