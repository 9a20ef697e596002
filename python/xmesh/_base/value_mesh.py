"""ValueMesh: the results of a call, one per actor, indexed like the mesh that was called."""
import html
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from .display import html_table
from .shape import MeshTrait, Point, slice_shape

T = TypeVar("T")


class ValueMesh(MeshTrait, Generic[T]):
    """One value per element of a mesh, indexed like it: `.item(**coords)`, `.items()`
    ((Point, value) pairs), `.values()`, `.get(rank)`, slicing as on any mesh."""

    def __init__(self, shape: Any, values: list) -> None:
        if len(values) != shape.size:
            raise ValueError(f"a mesh of {shape.size} needs {shape.size} values, got {len(values)}")
        self._shape = shape
        self._values = list(values)

    def _new_with_shape(self, shape):
        # Values are stored in our own row-major order; map the new shape's global ranks back.
        pos = {g: i for i, g in enumerate(self._shape.ranks())}
        return ValueMesh(shape, [self._values[pos[g]] for g in shape.ranks()])

    def item(self, **coords: int) -> Any:
        """The value at these coordinates (every dimension named), or the only value."""
        if not coords:
            if self._shape.size != 1:
                raise ValueError(f"item() without coordinates needs a mesh of one value; this one has "
                                 f"{self._shape.size} {self.sizes}")
            return self._values[0]
        missing = [d for d in self._shape.labels if d not in coords]
        extra = [k for k in coords if k not in self._shape.labels]
        if extra:
            raise KeyError(f"item has extra dimensions: {extra}")
        if missing:
            raise KeyError(f"item needs a coordinate for every dimension; missing: {missing}")
        sub = slice_shape(self._shape, **coords)
        pos = {g: i for i, g in enumerate(self._shape.ranks())}
        return self._values[pos[sub.ranks()[0]]]

    def items(self) -> Iterator[tuple[Point, Any]]:
        for i, v in enumerate(self._values):
            yield Point(i, self._shape), v

    def values(self) -> list:
        """The values in rank order (a list, as Monarch's)."""
        return list(self._values)

    def get(self, rank: int) -> Any:
        """The value of the rank-th element of this mesh (row-major, from 0)."""
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise TypeError(f"get() takes a rank (an int), got {rank!r}")
        if not 0 <= rank < len(self._values):
            raise IndexError(f"rank {rank} is out of range for a ValueMesh of {len(self._values)}")
        return self._values[rank]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self):
        return self.items()

    def __eq__(self, other):
        return isinstance(other, ValueMesh) and self.sizes == other.sizes and self._values == other._values

    def __repr__(self):
        lines = [f"ValueMesh({self.sizes}):"]
        for p, v in self.items():
            coords = ", ".join(f"{k}={c}" for k, c in p.items()) or "-"
            lines.append(f"  ({coords}): {v!r}")
        return "\n".join(lines)

    def _repr_html_(self):
        rows = [list(p.values()) + [repr(v)] for p, v in self.items()]
        return html_table(f"ValueMesh {html.escape(str(self.sizes))}", list(self._shape.labels) + ["value"], rows)

    def __reduce__(self):
        return (ValueMesh, (self._shape, self._values))
