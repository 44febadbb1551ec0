"""numpy arrays to and from the KServe datatypes tensors travel in."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from .errors import InvalidArgument

# (numpy kind, item size) -> KServe datatype.
_DATATYPES = {
    ("f", 2): "FP16",
    ("f", 4): "FP32",
    ("f", 8): "FP64",
    ("i", 1): "INT8",
    ("i", 2): "INT16",
    ("i", 4): "INT32",
    ("i", 8): "INT64",
    ("u", 1): "UINT8",
    ("u", 2): "UINT16",
    ("u", 4): "UINT32",
    ("u", 8): "UINT64",
    ("b", 1): "BOOL",
}

DATATYPE_TO_DTYPE = {
    datatype: np.dtype(("<" if size > 1 else "|") + kind + str(size))
    for (kind, size), datatype in _DATATYPES.items()
}


def to_wire(name: str, value: Any) -> Tuple[str, str, list, np.ndarray]:
    """(name, datatype, shape, little-endian C-contiguous array) for one input tensor."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"input names must be non-empty strings, not {name!r}")
    array = np.asarray(value)
    datatype = _DATATYPES.get((array.dtype.kind, array.dtype.itemsize))
    if datatype is None:
        raise InvalidArgument(
            f"input {name!r} has numpy dtype {array.dtype}, which no Cloister datatype "
            f"matches (supported: float16/32/64, int8..int64, uint8..uint64, bool)"
        )
    wire_dtype = DATATYPE_TO_DTYPE[datatype]
    if array.dtype != wire_dtype:  # big-endian (or '=' spelled differently): make it '<'
        array = array.astype(wire_dtype)
    if not array.flags.c_contiguous:
        # (not numpy.ascontiguousarray: it turns a 0-d array into a 1-d one)
        array = np.array(array, order="C")
    return name, datatype, list(array.shape), array
