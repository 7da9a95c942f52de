"""``llmgw mirror add``: plan a version from its sources, download what is missing, publish when complete.

Owns the order of an add: take the version's lock, build the plan (resolve the
revision, list the repository, read the safetensors index, select files), refuse
to change an existing version's plan, download the files not yet verified,
record each verified file, and write ``manifest.json`` only when the core's
completeness rule says the version is complete. Running it again resumes; on a
complete version it does nothing. Must not serve files or delete versions.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from llmgw.core.mirror import (
    FileUrl,
    HubRepo,
    ManifestFile,
    MirrorRef,
    PlannedFile,
    RelPath,
    SelectionError,
    Source,
    VersionPlan,
    VersionState,
    VersionStatus,
    check_name,
    check_rel_path,
    check_version,
    index_path,
    manifest_from_plan,
    select_files,
    shards_of_index,
)
from llmgw.core.mirror.manifest import ManifestError
from llmgw.mirror.credentials import HubToken
from llmgw.mirror.errors import DownloadFailed, MirrorError, VersionConflict
from llmgw.mirror.hub import HubClient
from llmgw.mirror.progress import ProgressSink
from llmgw.mirror.settings import MirrorSettings
from llmgw.mirror.store import DirectoryStore
from llmgw.mirror.transfer import Downloaded, Downloader, DownloadJob, Throttle


@dataclass(frozen=True)
class AddRequest:
    name: str
    version: str | None  # None: derived from the sources (the commit for a repository)
    sources: tuple[Source, ...]
    revision: str | None = None
    patterns: tuple[str, ...] = ()


@dataclass(frozen=True)
class AddOutcome:
    status: VersionStatus
    downloaded: tuple[Downloaded, ...]
    already_verified: int
    failures: tuple[DownloadFailed, ...]

    @property
    def complete(self) -> bool:
        return self.status.state is VersionState.COMPLETE


@dataclass(frozen=True)
class _Planned:
    plan: VersionPlan
    urls: dict[RelPath, str]


def derived_version(sources: Sequence[Source], commit: str | None) -> str:
    """The version when the user gives none: a repository's commit, or a digest of the URLs."""
    if commit is not None:
        return commit[:12]
    text = "\n".join(sorted(s.url if isinstance(s, FileUrl) else s.repo_id for s in sources))
    return "u" + hashlib.sha256(text.encode()).hexdigest()[:11]


async def plan_version(hub: HubClient, request: AddRequest) -> _Planned:
    repos = [s for s in request.sources if isinstance(s, HubRepo)]
    if repos:
        repo = repos[0]
        commit = await hub.resolve_revision(repo.repo_id, request.revision or "main")
        listing = await hub.list_files(repo.repo_id, commit)
        wanted_index = index_path(listing.files, request.patterns)
        shards = None
        if wanted_index is not None:
            text = await hub.read_small_file(repo.repo_id, commit, wanted_index)
            shards = shards_of_index(text.decode("utf-8", errors="replace"))
        selection = select_files(listing.files, patterns=request.patterns, index_shards=shards)
        ref = MirrorRef(
            check_name(request.name),
            check_version(request.version or derived_version(request.sources, commit)),
        )
        plan = VersionPlan(
            ref=ref,
            source=repo.repo_id,
            revision=commit,
            files=selection.files,
            index_shards=selection.index_shards,
        )
        return _Planned(plan, {f.path: hub.file_url(repo.repo_id, commit, f.path) for f in selection.files})
    if request.revision is not None or request.patterns:
        raise MirrorError("--revision and --file apply to a repository id, not to file URLs")
    urls = [s for s in request.sources if isinstance(s, FileUrl)]
    try:
        files = tuple(PlannedFile(check_rel_path(u.filename), None, u.sha256) for u in urls)
    except ManifestError as exc:
        raise MirrorError(f"cannot store that URL's file under its name: {exc}") from None
    ref = MirrorRef(check_name(request.name), check_version(request.version or derived_version(urls, None)))
    plan = VersionPlan(ref=ref, source=" ".join(u.describe() for u in urls), revision=None, files=files)
    return _Planned(plan, {check_rel_path(u.filename): u.url for u in urls})


async def add_version(
    store: DirectoryStore,
    request: AddRequest,
    settings: MirrorSettings,
    progress: ProgressSink,
    token: HubToken | None,
) -> AddOutcome:
    async with aiohttp.ClientSession() as session:
        hub = HubClient(session, settings, token)
        try:
            planned = await plan_version(hub, request)
        except SelectionError as exc:
            raise MirrorError(str(exc)) from None
        plan = planned.plan
        ref = plan.ref
        with store.locked(ref):
            existing = store.read_plan(ref)
            if existing is not None and not existing.same_content(plan):
                raise VersionConflict(_conflict_message(existing, plan))
            if existing is None:
                store.write_plan(plan)
            verified = store.read_verified(ref)
            todo = [f for f in plan.files if not _satisfied(f, verified)]
            progress.note(
                f"{ref.source}: {plan.source}"
                + (f" at {plan.revision}" if plan.revision else "")
                + f", {len(plan.files)} file(s), {len(plan.files) - len(todo)} already verified"
            )
            downloaded: list[Downloaded] = []
            failures: list[DownloadFailed] = []
            if todo:
                loop = asyncio.get_running_loop()
                throttle = Throttle(settings.bandwidth_limit, loop.time) if settings.bandwidth_limit else None
                downloader = Downloader(
                    session, settings, progress, token=token, token_origin=hub.endpoint, throttle=throttle
                )
                jobs = [
                    DownloadJob(
                        url=planned.urls[f.path],
                        dest=store.local_path(ref, f.path),
                        label=f.path,
                        size=f.size,
                        sha256=f.sha256,
                    )
                    for f in todo
                ]
                progress.begin(len(jobs), _known_total(todo))
                try:
                    for result in await downloader.fetch_all(jobs):
                        if isinstance(result, DownloadFailed):
                            failures.append(result)
                            continue
                        downloaded.append(result)
                        store.record_verified(
                            ref, ManifestFile(RelPath(result.job.label), result.size, result.sha256)
                        )
                finally:
                    progress.close()
            status = store.status(ref, holding_lock=True)
            assert status is not None  # the plan was written above, under the lock
            if status.state is VersionState.COMPLETE:
                store.write_manifest(manifest_from_plan(plan, store.read_verified(ref)))
        return AddOutcome(status, tuple(downloaded), len(plan.files) - len(todo), tuple(failures))


def _satisfied(planned: PlannedFile, verified: dict[RelPath, ManifestFile]) -> bool:
    record = verified.get(planned.path)
    if record is None:
        return False
    return (planned.size is None or record.size == planned.size) and (
        planned.sha256 is None or record.sha256 == planned.sha256
    )


def _known_total(files: Sequence[PlannedFile]) -> int | None:
    sizes = [f.size for f in files]
    return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


def _conflict_message(existing: VersionPlan, new: VersionPlan) -> str:
    ref = existing.ref
    was = existing.source + (f" at {existing.revision}" if existing.revision else "")
    now = new.source + (f" at {new.revision}" if new.revision else "")
    if existing.source == new.source and existing.revision != new.revision and existing.revision:
        return (
            f"{ref} was started from {was}, but the revision now resolves to {new.revision}: "
            f"finish it with --revision {existing.revision}, or add the new commit under another version"
        )
    if was == now:
        return f"{ref} was started with a different file selection; finish it with the same --file options"
    return f"{ref} already holds {was}; versions never change: add {now} under another version"
