"""openpi's msgpack-numpy wire format, decoded without trusting the sender.

An array travels as a map ``{b"__ndarray__": True, b"data": bytes, b"dtype": str,
b"shape": [int, ...]}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": value,
b"dtype": str}`` (openpi-client's ``msgpack_numpy``). openpi's own decoder hands the declared
dtype and shape straight to numpy; here they are checked first:

- the dtype string must be one of ``ALLOWED_DTYPES`` (bool, integers, floats; native or
  little-endian spelling), so an object, structured or void dtype never reaches numpy's parser;
- the shape must be a short list of non-negative integers whose product times the item size is
  exactly the length of the buffer (computed with Python integers: a huge declared shape cannot
  overflow, allocate or hang);
- nothing is ever unpickled (msgpack has no such path, and no fallback is added).

A bad array does not abort decoding: it becomes a ``BadValue`` carrying the reason, and the
caller reports it under the field it was found in (``find_bad``). Replies are packed in the same
format (``pack``), so ``openpi_client.msgpack_numpy.unpackb`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

ALLOWED_DTYPES = frozenset(
    {"|b1", "|u1", "|i1"}
    | {f"{order}{kind}{size}" for order in "<=" for kind in "ui" for size in (2, 4, 8)}
    | {f"{order}f{size}" for order in "<=" for size in (2, 4, 8)}
)
MAX_NDIM = 8
ARRAY, GENERIC = b"__ndarray__", b"__npgeneric__"


class WireError(ValueError):
    """The frame itself cannot be read (not msgpack, not a map)."""


@dataclass(frozen=True)
class BadValue:
    """An array or scalar the sender described wrongly; ``reason`` says how."""

    reason: str


def _describe_dtype(dtype: object) -> str:
    text = repr(dtype)
    return text if len(text) <= 40 else text[:37] + "..."


def _array(obj: dict) -> np.ndarray | BadValue:
    data, dtype, shape = obj.get(b"data"), obj.get(b"dtype"), obj.get(b"shape")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        return BadValue(
            f"dtype {_describe_dtype(dtype)} is not allowed (bool, integer or float arrays only)"
        )
    if not isinstance(data, bytes):
        return BadValue("array data is not a byte string")
    if (
        not isinstance(shape, list | tuple)
        or len(shape) > MAX_NDIM
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        return BadValue(f"shape must be a list of at most {MAX_NDIM} non-negative integers")
    itemsize = int(dtype[-1])
    needed = itemsize
    for d in shape:
        needed *= d
    if needed != len(data):
        shown = list(shape) if len(repr(list(shape))) <= 60 else "[...]"
        return BadValue(
            f"declared shape {shown} of {dtype} needs {needed} bytes but the "
            f"buffer holds {len(data)}"
        )
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))


def _generic(obj: dict) -> np.generic | BadValue:
    dtype, data = obj.get(b"dtype"), obj.get(b"data")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        return BadValue(
            f"dtype {_describe_dtype(dtype)} is not allowed (bool, integer or float scalars only)"
        )
    if type(data) not in (bool, int, float):
        return BadValue("scalar data is not a number")
    try:
        with np.errstate(over="raise", invalid="raise"):
            return np.dtype(dtype).type(data)
    except (OverflowError, ValueError, FloatingPointError):
        return BadValue(f"scalar {data!r} does not fit {dtype}")


def _object_hook(obj: dict) -> object:
    if ARRAY in obj:
        return _array(obj)
    if GENERIC in obj:
        return _generic(obj)
    return obj


def unpack(frame: bytes) -> dict:
    """The observation map of one frame; arrays are read-only views of the frame's bytes.
    Raises ``WireError`` when the frame is not a msgpack map."""
    try:
        obj = msgpack.unpackb(frame, object_hook=_object_hook, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types (ExtraData, FormatError, ...)
        raise WireError(f"frame: not a msgpack-numpy message ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise WireError(f"frame: expected a map of observation fields, got {type(obj).__name__}")
    return obj


def find_bad(value: object, path: str = "") -> tuple[str, BadValue] | None:
    """The first ``(field path, BadValue)`` inside ``value`` (maps and lists), else None."""
    if isinstance(value, BadValue):
        return path, value
    if isinstance(value, dict):
        for key, item in value.items():
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            found = find_bad(item, f"{path}/{name}" if path else name)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = find_bad(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _default(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        if obj.dtype.str not in ALLOWED_DTYPES:
            raise TypeError(f"cannot send an array of dtype {obj.dtype}")
        array = np.ascontiguousarray(obj)
        return {
            ARRAY: True,
            b"data": array.tobytes(),
            b"dtype": array.dtype.str,
            b"shape": list(array.shape),
        }
    if isinstance(obj, np.generic):
        if obj.dtype.str not in ALLOWED_DTYPES:
            raise TypeError(f"cannot send a scalar of dtype {obj.dtype}")
        return {GENERIC: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__}")


def pack(obj: object) -> bytes:
    """``obj`` (maps, lists, numbers, strings, numpy arrays/scalars) as one msgpack frame."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def lookup(obs: dict, key: str) -> object:
    """``obs[key]``, else the nested path ``obs[a][b]`` of ``key = "a/b"`` (openpi's
    flat and nested observation keys alike); None when absent."""
    if key in obs:
        return obs[key]
    node: object = obs
    for part in key.split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
