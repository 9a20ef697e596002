"""Named-dimension operations shared by ProcMesh, ActorMesh and ValueMesh (Monarch's
MeshTrait). The arithmetic lives in C++ (`_core.Shape`); this adds the Python surface."""
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, Union

from .. import _core

Shape = Any  # a _core.Shape (the pybind11 module has no stubs)
_Mesh = TypeVar("_Mesh", bound="MeshTrait")


def format_coords(coords, sep=", "):
    """"hosts=0, gpus=3": the one way coordinates (and sizes, with sep=" x ") are written."""
    return sep.join(f"{k}={v}" for k, v in coords.items())


def ranks_text(ranks):
    """"rank 3" or "ranks 0-2,5"."""
    text = _core.describe_ranks(list(ranks))
    return text if text.startswith("ranks") else f"rank {text}"


def parse_ranks(text: str) -> "set[int]":
    """The ranks a person wrote: "3", "0-3", "1,4,6-7" (what ranks_text writes, and `xmesh logs`
    users type); ValueError naming what does not read."""
    ranks: "set[int]" = set()
    for part in str(text).replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{text!r} is not a rank list: write one rank (3), a range (0-3) or several (1,4,6-7)")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"the range {part!r} ends before it starts")
        if last - first > 1 << 20:
            raise ValueError(f"the range {part!r} is too long")
        ranks.update(range(first, last + 1))
    return ranks


class Extent(Mapping):
    """The sizes of a mesh's dimensions, in order: a read-only mapping {label: size} with
    `.labels`, `.sizes` and `.nelements` (Monarch's Extent). Equal to a dict of the same items."""

    __slots__ = ("_labels", "_sizes")

    def __init__(self, labels: Iterable[str], sizes: Iterable[int]) -> None:
        labels, sizes = list(labels), list(sizes)
        if len(labels) != len(sizes):
            raise ValueError(f"an extent needs one size per label, got labels {labels} and sizes {sizes}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"an extent's labels must differ, got {labels}")
        for label, size in zip(labels, sizes):
            if not isinstance(label, str):
                raise TypeError(f"an extent's labels are strings, got {label!r}")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ValueError(f"dimension {label!r} needs a size >= 0, got {size!r}")
        self._labels, self._sizes = labels, sizes

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        n = 1
        for size in self._sizes:
            n *= size
        return n

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __iter__(self):
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other):
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        return Mapping.__eq__(self, other)

    def __hash__(self):
        return hash((tuple(self._labels), tuple(self._sizes)))

    def __repr__(self):
        return f"Extent({dict(zip(self._labels, self._sizes))})"

    def __str__(self):
        return "{" + ", ".join(f"'{k}': {v}" for k, v in zip(self._labels, self._sizes)) + "}"

    def __reduce__(self):
        return (Extent, (self._labels, self._sizes))

    def shape(self) -> Shape:
        """The dense shape of ranks 0..nelements-1 over these dimensions."""
        return _core.Shape.dense(self._labels, self._sizes)


def extent_of(shape: Shape) -> Extent:
    return Extent(shape.labels, shape.sizes)


class Point(Mapping):
    """A position in a mesh: `.rank` (row-major index) and a coordinate per dimension,
    readable as `point["gpus"]` or `point.gpus`. Made from a rank and the mesh's shape, or
    as in Monarch from a rank and an Extent (or a {label: size} dict)."""

    __slots__ = ("rank", "shape", "_coords")

    def __init__(self, rank: int, shape: "Shape | Extent | Mapping[str, int]") -> None:
        if isinstance(shape, Mapping):
            extent = shape if isinstance(shape, Extent) else Extent(shape.keys(), shape.values())
            if not 0 <= rank < max(1, extent.nelements):
                raise IndexError(f"rank {rank} is outside an extent of {extent.nelements} ({extent})")
            shape = extent.shape()
        self.rank = rank
        self.shape = shape
        values = shape.coords_of(rank) if shape.size > 0 and shape.ndim > 0 else []
        self._coords = dict(zip(shape.labels, values))

    def __getitem__(self, key):
        return self._coords[key]

    def __iter__(self):
        return iter(self._coords)

    def __len__(self):
        return len(self._coords)

    def __getattr__(self, name):
        try:
            return self._coords[name]
        except KeyError:
            raise AttributeError(f"point has no dimension {name!r}; its dimensions are {tuple(self._coords)}") from None

    @property
    def extent(self) -> Extent:
        return extent_of(self.shape)

    def size(self, label: str) -> int:
        """The size of one dimension of the mesh this point is in (Monarch's Point.size)."""
        if label not in self._coords:
            raise KeyError(f"point has no dimension {label!r}; its dimensions are {tuple(self._coords)}")
        return self.shape.dim_size(label)

    def __repr__(self):
        inner = format_coords(self._coords)
        return f"Point(rank={self.rank}{', ' if inner else ''}{inner})"

    def __str__(self):
        """Monarch's text: each coordinate over its dimension's size, "{'hosts': 0/1, 'gpus': 1/2}"."""
        sizes = dict(zip(self.shape.labels, self.shape.sizes)) if self.shape.ndim else {}
        return "{" + ", ".join(f"{label!r}: {c}/{sizes.get(label, '?')}" for label, c in self._coords.items()) + "}"

    def __eq__(self, other):
        if isinstance(other, Point):
            return self.rank == other.rank and self._coords == other._coords
        return Mapping.__eq__(self, other)

    def __hash__(self):
        return hash((self.rank, tuple(self._coords.items())))

    def __reduce__(self):
        return (Point, (self.rank, self.shape))


def dense_shape(sizes):
    """A Shape over ranks 0..N-1 from an ordered {label: size} dict."""
    for k, v in sizes.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"dimension names must be identifiers, got {k!r}")
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"dimension {k!r} must have a positive integer size, got {v!r}")
    return _core.Shape.dense(list(sizes.keys()), list(sizes.values()))


def slice_shape(shape, **kwargs):
    for label, sel in kwargs.items():
        if label not in shape.labels:
            raise TypeError(f"mesh has no dimension {label!r}; its dimensions are {tuple(shape.labels)}")
        size = shape.dim_size(label)
        if isinstance(sel, slice):
            start, stop, step = sel.indices(size)
            if step <= 0:
                raise ValueError(f"slice step must be positive, got {step}")
            shape = shape.select(label, start, stop, step)
        elif isinstance(sel, int) and not isinstance(sel, bool):
            if sel < 0 or sel >= size:
                raise IndexError(f"index {sel} out of range for dimension {label!r} of size {size}")
            shape = shape.at(label, sel)
        else:
            raise TypeError(f"dimension {label!r} must be selected by an int or a slice, got {type(sel).__name__}")
    return shape


class MeshTrait:
    """Mixin: subclasses provide `_base.shape` (a `_core.Shape`) and `_new_with_shape(shape)`."""

    _shape: Shape

    def _new_with_shape(self: _Mesh, shape: Shape) -> _Mesh:
        raise NotImplementedError

    def slice(self: _Mesh, **kwargs: Union[int, slice]) -> _Mesh:
        """Select along named dimensions: an int drops the dimension, a slice keeps it.

        mesh.slice(hosts=0, gpus=slice(0, 4))"""
        return self._new_with_shape(slice_shape(self._shape, **kwargs))

    def split(self: _Mesh, **kwargs: Any) -> _Mesh:
        """Split dimensions into several: mesh.split(gpus=("dp", "tp"), tp=2)."""
        splits: dict[str, list[str]] = {}
        constraints: dict[str, int] = {}
        for key, value in kwargs.items():
            if key in self._shape.labels:
                if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"expected a sequence of dimension names for {key!r}, got {value!r}")
                splits[key] = list(value)
            else:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"{key!r} is not an existing dimension; expected an integer size for a new one")
                constraints[key] = value
        return self._new_with_shape(self._shape.split(splits, constraints))

    def flatten(self: _Mesh, name: str) -> _Mesh:
        """All dimensions folded into one named `name` (dense meshes only)."""
        return self._new_with_shape(self._shape.flatten(name))

    def rename(self: _Mesh, **kwargs: str) -> _Mesh:
        """mesh.rename(gpus="workers")"""
        return self._new_with_shape(self._shape.rename({k: v for k, v in kwargs.items()}))

    def size(self, dim: Union[None, str, Iterable[str]] = None) -> int:
        """Number of elements in the mesh, or along one dimension or several."""
        if dim is None:
            return self._shape.size
        if isinstance(dim, str):
            if dim not in self._shape.labels:
                raise KeyError(f"mesh has no dimension {dim!r}; its dimensions are {tuple(self._shape.labels)}")
            return self._shape.dim_size(dim)
        n = 1
        for d in dim:
            n *= self.size(d)
        return n

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self._shape.labels, self._shape.sizes))

    @property
    def extent(self) -> Extent:
        """The mesh's dimensions and sizes (equal to `sizes`, as Monarch's Extent)."""
        return extent_of(self._shape)

    @property
    def shape(self) -> Shape:
        """This (possibly sliced) mesh's shape: its dimensions and the ranks it covers."""
        return self._shape

    def __len__(self):
        return self._shape.size
