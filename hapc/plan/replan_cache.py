"""The strategy cache beside an old plan, as ``hapc replan`` uses it (:mod:`synth.reuse` keeps
the format): installed for the old plan's graph when sound, carried to the new plan's folder so
that replans chain.

The cache is checked by the old ``plan.json``'s SHA-256 (its stamp) when the file was not
replaced between loading the plan and hashing it, and by the graph's fingerprint otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hapc.ir.graph import Graph
from synth import reuse

FileIdentity = tuple[int, int, int, int]


def file_identity(path: Path) -> FileIdentity | None:
    """(device, inode, size, modification time) of ``path``: what changes when it is replaced
    or written (None when it cannot be read)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def install_old(plan_file: Path, graph: Graph, say: Callable[[str], None],
                identity: FileIdentity | None = None) -> Path | None:
    """Install the strategies cached beside the old plan ``plan_file`` (its graph ``graph``),
    so the search needs no sharding rules (nor torch); a missing or stale cache is not an
    error: the rules derive them again, more slowly, and ``say`` tells why. Returns the cache
    used.

    ``identity`` (:func:`file_identity` of ``plan_file`` before ``graph`` was loaded from it):
    when the file is unchanged since, its digest stands for the bytes ``graph`` came from, and
    a cache stamped with it is not fingerprinted again."""
    path = reuse.cache_path(plan_file)
    digest = None
    if identity is not None:
        digest = reuse.plan_digest(plan_file)
        if file_identity(plan_file) != identity:
            digest = None                   # replaced meanwhile: the fingerprint decides
    try:
        reuse.load(graph, path, plan_sha256=digest)
    except reuse.StaleCache as exc:
        say(f"{exc}: deriving the strategies from the sharding rules (slower)")
        return None
    return path


def carry(cache: Path | None, graph: Graph, derived: bool, out: Path) -> None:
    """Give the new plan written to ``out/plan.json`` (its graph ``graph``, the old plan's) its
    cache: the old one (``cache``) stamped for the new file; when that was unusable but the
    replan ``derived`` the strategies (it searched), a new one; else none."""
    target = out / reuse.FILE_NAME
    if cache is not None:
        reuse.restamp(cache, target, out / "plan.json")
        return
    target.unlink(missing_ok=True)
    if derived:
        reuse.write(graph, target, plan_file=out / "plan.json")
