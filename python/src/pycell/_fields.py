"""The dataclass field of pycell's protocol types, with its JSON rule
(which `pycell._codec` reads): kept apart from the codec, which raises
`pycell.errors`' exceptions, so that the types import no codec.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def field(*, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING, omit: str | None = None) -> Any:
    """A dataclass field with its JSON rule: `omit` is None (always
    written), "none", "empty", "false" or "zero"."""
    meta = {"omit": omit}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)
