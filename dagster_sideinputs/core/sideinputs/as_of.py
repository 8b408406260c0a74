"""The validity of a temporal (as-of) side input's rows: :class:`AsOf`."""

import datetime as dt
from dataclasses import dataclass

from dagster_sideinputs.errors import DeclarationError


@dataclass(frozen=True)
class AsOf:
    """Where the validity of a temporal (as-of) map's rows comes from.

    Each main record sees, for its key, the side row valid at its event time (Flink
    SQL's ``FOR SYSTEM_TIME AS OF``, Kafka Streams' versioned stores). Build one with
    :meth:`column` (validity in columns of the side table) or :meth:`history` (the side
    table's own Delta history: the row as the table held it at that time). A column
    name given directly to ``SideInput.map(..., as_of="valid_from")`` means
    ``AsOf.column("valid_from")``.

    Attributes:
        valid_from: side column: when the row starts being valid (None: Delta history).
        valid_to: side column: when it stops (exclusive); None: when the key's next row
            starts.
        grace: when the data valid at a record's time becomes final by the batch clock,
            even if no later side data comes: ``grace`` after that time. Without it, a
            record waits until the side table holds data from after its time.
    """

    valid_from: str | None = None
    valid_to: str | None = None
    grace: dt.timedelta | None = None

    def __post_init__(self) -> None:
        if self.valid_to is not None and self.valid_from is None:
            raise DeclarationError(
                "AsOf(valid_to=...) needs valid_from= too.",
                fix='AsOf.column("valid_from", valid_to="valid_to")',
            )
        for name in (self.valid_from, self.valid_to):
            if name is not None and (not isinstance(name, str) or not name):
                raise DeclarationError(f"AsOf columns are column names, got {name!r}.")
        if self.grace is not None and self.grace < dt.timedelta(0):
            raise DeclarationError(f"AsOf grace must be >= 0, got {self.grace}.")

    @classmethod
    def column(
        cls,
        valid_from: str,
        *,
        valid_to: str | None = None,
        grace: dt.timedelta | None = None,
    ) -> "AsOf":
        """Validity from the side table's columns: a row of key k is valid from its
        ``valid_from`` until its ``valid_to`` (exclusive), or, without ``valid_to``,
        until the next ``valid_from`` of key k."""
        return cls(valid_from, valid_to, grace)

    @classmethod
    def history(cls, *, grace: dt.timedelta | None = None) -> "AsOf":
        """Validity from the side table's Delta history: a record at time t sees the
        table as the newest version committed at or before t held it."""
        return cls(grace=grace)

    @property
    def is_history(self) -> bool:
        return self.valid_from is None

    def __repr__(self) -> str:
        grace = f"grace={self.grace!r}" if self.grace is not None else ""
        if self.is_history:
            return f"AsOf.history({grace})"
        extra = f", valid_to={self.valid_to!r}" if self.valid_to else ""
        return f"AsOf.column({self.valid_from!r}{extra}{', ' + grace if grace else ''})"
