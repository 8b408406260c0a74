"""A snapshot's live files, turned into values only when a caller reads them."""

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from dagster_sideinputs.delta.engine import DataFile


class LazyFiles(Sequence[DataFile]):
    """A snapshot's live files, turned into :class:`DataFile` values on first use.

    Reading a version's metadata is cheap; turning each of its live files (with typed
    statistics) into a Python value costs ~0.1 ms per file, i.e. seconds for a table that
    has gained a file per batch for 10,000 batches. Most snapshots are taken for their
    version, schema or table id (the main input's latest version, an output's schema
    before a write): they never pay for the files. ``load`` must give the files of the
    snapshot's own version whenever it is called (it is called once).
    """

    def __init__(self, load: Callable[[], tuple[DataFile, ...]]) -> None:
        self._load: Callable[[], tuple[DataFile, ...]] | None = load
        self._files: tuple[DataFile, ...] | None = None

    def _loaded(self) -> tuple[DataFile, ...]:
        if self._files is None:
            assert self._load is not None
            self._files = self._load()
            self._load = None
        return self._files

    @overload
    def __getitem__(self, index: int) -> DataFile: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[DataFile, ...]: ...

    def __getitem__(self, index: int | slice) -> DataFile | tuple[DataFile, ...]:
        return self._loaded()[index]

    def __len__(self) -> int:
        return len(self._loaded())

    def __iter__(self) -> Iterator[DataFile]:
        return iter(self._loaded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyFiles):
            return self._loaded() == other._loaded()
        return isinstance(other, tuple) and self._loaded() == other

    def __hash__(self) -> int:
        return hash(self._loaded())

    def __repr__(self) -> str:
        return repr(self._loaded())

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, (self._loaded(),))  # pickles as the plain tuple
