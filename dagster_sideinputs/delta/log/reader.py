"""Reading a Delta table's transaction log for the delta-spark engine, without delta-rs.

delta-spark keeps what it knows about a table (the live files, their statistics, the
application transactions) in its JVM, which Python reaches only through py4j internals,
and not at all over Spark Connect. The native engine therefore reads ``_delta_log``
itself, as the Delta protocol specifies: the newest complete checkpoint at or below a
version, then the JSON commits after it (:mod:`~dagster_sideinputs.delta.log.replay`),
from files read locally or through Spark (:mod:`~dagster_sideinputs.delta.log.files`).

This module owns the :class:`LogReader`: replayed states are immutable per version and
cached (keyed by the table, the version and the size and time of the files they came
from), and a newer version is replayed from the newest cached one. Where the log can be
probed (local filesystems), asking again costs a stat of the known newest commit (is it
still the same table?) and one per newer commit: nothing that grows with the table's
history, where a listing of ``_delta_log`` would. Elsewhere it costs a listing.

The delta-rs bridge reads local tables' metadata through this reader too (delta-rs lists
the log on every open): both engines' per-batch metadata costs stay flat.
"""

import datetime as dt
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from dagster_sideinputs.delta.log.commits import log_cleaned_up, reading_log, reads_log
from dagster_sideinputs.delta.log.files import LOG_DIR, LogFiles
from dagster_sideinputs.delta.log.replay import (
    LogListing,
    Replay,
    check_features,
    commit_time_ms,
    from_ms,
    parse_listing,
)
from dagster_sideinputs.delta.log.state import LogState
from dagster_sideinputs.delta.store.files import normalize_uri
from dagster_sideinputs.errors import NotADeltaTableError, TableNotFoundError


class LogReader:
    """Replays table logs, caching states (one reader per process is enough)."""

    def __init__(self, capacity: int = 64) -> None:
        self._cache: OrderedDict[tuple[str, int], LogState] = OrderedDict()
        self._lock = threading.Lock()
        self._capacity = capacity
        self._timestamps: dict[tuple[str, int, int, int], dt.datetime] = {}

    # --- cache ------------------------------------------------------------------------------

    def _cached(self, root: str, version: int, signature: tuple) -> LogState | None:
        with self._lock:
            state = self._cache.get((root, version))
            if state is not None and state.signature == signature:
                self._cache.move_to_end((root, version))
                return state
            return None

    def _remember(self, state: LogState) -> None:
        with self._lock:
            self._cache[(state.root, state.version)] = state
            self._cache.move_to_end((state.root, state.version))
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)

    def _newest_cached(self, root: str, below: int, listing: LogListing) -> LogState | None:
        """The newest cached state of ``root`` at or below ``below`` that the listing still
        has (same commit file), to replay forward from."""
        with self._lock:
            candidates = [s for (r, v), s in self._cache.items() if r == root and v <= below]
        for state in sorted(candidates, key=lambda s: -s.version):
            entry = listing.commits.get(state.version)
            if entry is not None and state.signature == (entry.name, entry.size, entry.mtime_ms):
                return state
        return None

    # --- reading ----------------------------------------------------------------------------

    def listing(self, files: LogFiles) -> LogListing | None:
        entries = files.list_log()
        if entries is None:
            return None
        listing = parse_listing(entries)
        return listing if listing.latest >= 0 else None

    def latest_version(self, files: LogFiles) -> int | None:
        probed = self._probe(files)
        if probed is not None:
            return max(probed.commits)
        listing = self.listing(files)
        return None if listing is None else listing.latest

    def _newest_known(self, root: str) -> LogState | None:
        with self._lock:
            known = [s for (r, _), s in self._cache.items() if r == root]
        return max(known, key=lambda s: s.version, default=None)

    def _probe(self, files: LogFiles) -> LogListing | None:
        """The commits from the newest cached state of this table on, found by asking for
        each next commit file (None: the log cannot be probed, no state is cached, or the
        cached state's commit file changed, e.g. the table was created again)."""
        if not files.probes:
            return None
        known = self._newest_known(files.root)
        if known is None:
            return None
        name = f"{known.version:020d}.json"
        entry = files.entry(name)
        if entry is None or (entry.name, entry.size, entry.mtime_ms) != known.signature:
            return None
        commits = {known.version: entry}
        version = known.version + 1
        while (entry := files.entry(f"{version:020d}.json")) is not None:
            commits[version] = entry
            version += 1
        return LogListing(commits, {})

    def _probed_state(self, files: LogFiles, version: int | None, *, table: str) -> LogState | None:
        if not files.probes:
            return None
        if version is not None:  # a pinned version already replayed: is it still that table?
            name = f"{version:020d}.json"
            with self._lock:
                cached = self._cache.get((files.root, version))
            if cached is None or cached.signature[0] != name:
                return None
            entry = files.entry(name)
            if entry is None or (entry.name, entry.size, entry.mtime_ms) != cached.signature:
                return None
            return self._cached(files.root, version, cached.signature)
        listing = self._probe(files)
        if listing is None:
            return None
        target = listing.latest
        signature = listing.signature(target)
        cached = self._cached(files.root, target, signature)
        if cached is not None:
            return cached
        state = self._replay(files, listing, target, signature, table=table)
        self._remember(state)
        return state

    def state(self, files: LogFiles, version: int | None = None, *, table: str) -> LogState:
        """The table at ``version`` (latest when None).

        Raises:
            TableNotFoundError: no table, no such version, or commits gone from the log.
            NotADeltaTableError: the folder holds files but no Delta log.
            UnsupportedTableFeatureError: the log is owned by a catalog.
        """
        probed = self._probed_state(files, version, table=table)
        if probed is not None:
            return probed
        listing = self.listing(files)
        if listing is None:
            if files.holds_files():
                raise NotADeltaTableError(
                    f"{table} holds files but is not a Delta table (no {LOG_DIR} folder).",
                    fix="point the asset at a Delta table, or convert the parquet folder "
                    f"(delta-spark: CONVERT TO DELTA parquet.`{files.root}`; delta-rs: "
                    "`deltalake.convert_to_deltalake(uri)`)",
                )
            raise TableNotFoundError(
                f"No Delta table at {table}" + (f" (version {version})." if version else "."),
                fix="materialize the upstream asset first, or check the storage root and path",
            )
        target = listing.latest if version is None else version
        if target > listing.latest or target < 0:
            raise TableNotFoundError(
                f"Table {table} has no version {target} (latest: {listing.latest}).",
                fix="ask for an existing version (DESCRIBE HISTORY delta.`<path>`)",
            )
        signature = (
            listing.signature(target)
            if target in listing.commits or (target in listing.checkpoints)
            else ("", 0, 0)
        )
        cached = self._cached(files.root, target, signature)
        if cached is not None:
            return cached
        state = self._replay(files, listing, target, signature, table=table)
        self._remember(state)
        return state

    @reads_log
    def _replay(
        self,
        files: LogFiles,
        listing: LogListing,
        target: int,
        signature: tuple[str, int, int],
        *,
        table: str,
    ) -> LogState:
        checkpoint = max((v for v in listing.checkpoints if v <= target), default=-1)
        base = self._newest_cached(files.root, target, listing)
        replay = Replay(files.root)
        start = 0
        if base is not None and base.version >= checkpoint:
            replay.files = dict(base.files)
            replay.txns = dict(base.txns)
            replay.metadata = dict(base.metadata)
            replay.protocol = dict(base.protocol)
            start = base.version + 1
        elif checkpoint >= 0:
            replay.read_checkpoint(files, listing.checkpoints[checkpoint])
            start = checkpoint + 1
        missing = [v for v in range(start, target + 1) if v not in listing.commits]
        if missing:
            raise TableNotFoundError(
                f"Version {target} of table {table} cannot be read: commit(s) "
                f"{missing[:3]} are gone from {LOG_DIR} and no checkpoint covers them (log "
                "retention cleaned them up).",
                fix="read a newer version, or raise `delta.logRetentionDuration` on the table",
            )
        names = [listing.commits[v].name for v in range(start, target + 1)]
        if target in listing.commits and target < start:
            names_for_info = [listing.commits[target].name]
        else:
            names_for_info = []
        try:
            commits = files.read_json_lines(names + names_for_info)
        except FileNotFoundError as exc:
            raise TableNotFoundError(
                f"A commit of table {table} disappeared while it was read ({exc}).",
                fix="retry; if it keeps failing, the table is being deleted or cleaned up",
            ) from exc
        info = None
        for name in names:
            info = replay.apply(commits[name])
        if names_for_info:
            info = next(
                (a["commitInfo"] for a in commits[names_for_info[0]] if "commitInfo" in a), None
            )
        if not replay.metadata:
            raise TableNotFoundError(
                f"The log of table {table} has no metadata up to version {target}.",
                fix="check that the folder holds a complete Delta table",
            )
        check_features(replay.protocol, table)
        entry = listing.commits.get(target) or listing.checkpoints[target][0][0]
        return LogState(
            root=files.root,
            version=target,
            metadata=replay.metadata,
            protocol=replay.protocol,
            files=replay.files,
            txns=replay.txns,
            commit_timestamp_ms=commit_time_ms(info, entry.mtime_ms),
            signature=signature,
        )

    def commits(
        self, files: LogFiles, versions: Sequence[int], *, table: str
    ) -> dict[int, list[dict[str, Any]]]:
        """The actions of some commits.

        Raises:
            LogCleanedUpError: a commit is gone from the log.
        """
        names = {v: f"{v:020d}.json" for v in versions}
        try:
            with reading_log(table):
                read = files.read_json_lines(list(names.values()))
        except FileNotFoundError as exc:
            left = {entry.name for entry in files.list_log() or []}
            missing = next((v for v in versions if names[v] not in left), versions[0])
            raise log_cleaned_up(table, missing, left) from exc
        return {v: read[names[v]] for v in versions}

    def commit_timestamps(
        self, files: LogFiles, *, up_to: int | None = None, table: str
    ) -> list[tuple[int, dt.datetime]]:
        """``(version, commit time)`` of every commit file the log holds, oldest first:
        the in-commit timestamp, else ``commitInfo.timestamp``, else the file's time.
        Commit files never change, so each is read once per process.

        Raises:
            TableNotFoundError: the table has no commit files (or none up to ``up_to``).
        """
        listing = self.listing(files)
        entries = [] if listing is None else sorted(listing.commits.items())
        wanted = [(v, e) for v, e in entries if up_to is None or v <= up_to]
        if not wanted:
            raise TableNotFoundError(
                f"No commits in the Delta log of {table}"
                + (f" up to version {up_to}." if up_to is not None else "."),
                fix="materialize the table first",
            )
        root = normalize_uri(files.root)
        missing = [
            (v, e) for v, e in wanted if (root, v, e.size, e.mtime_ms) not in self._timestamps
        ]
        if missing:
            read = files.read_json_lines([e.name for _, e in missing])
            for version, entry in missing:
                info = next((a["commitInfo"] for a in read[entry.name] if "commitInfo" in a), None)
                with self._lock:
                    self._timestamps[(root, version, entry.size, entry.mtime_ms)] = from_ms(
                        commit_time_ms(info, entry.mtime_ms)
                    )
        return [(v, self._timestamps[(root, v, e.size, e.mtime_ms)]) for v, e in wanted]


READER = LogReader()
