"""openpi's msgpack-numpy format decoded without trusting the sender (recap.serve.wire)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy

from recap.serve.wire import BadValue, WireError, find_bad, pack, unpack


def raw_array(dtype: str, shape: list, data: bytes) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def frame(**fields) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def test_openpi_client_frames_decode_to_equal_arrays():
    obs = {
        "observation/image": np.arange(24, dtype=np.uint8).reshape(2, 4, 3),
        "observation/state": np.array([0.5, -1.25, 3.0], np.float32),
        "beta": np.float32(2.5),  # np.float64 is a float: sent as one
        "prompt": "pick up the bowl",
    }
    out = unpack(msgpack_numpy.packb(obs))
    assert out["observation/image"].dtype == np.uint8
    assert out["observation/image"].shape == (2, 4, 3)
    assert out["observation/image"][1, 3].tolist() == [21, 22, 23]
    assert out["observation/state"].tolist() == [0.5, -1.25, 3.0]
    assert out["beta"] == 2.5 and out["beta"].dtype == np.float32
    assert out["prompt"] == "pick up the bowl"


def test_replies_decode_with_openpi_client():
    reply = {"actions": np.array([[1.5, -2.0]], np.float32), "server_timing": {"infer_ms": 3.0}}
    out = msgpack_numpy.unpackb(pack(reply))
    assert out["actions"].dtype == np.float32
    assert out["actions"].tolist() == [[1.5, -2.0]]
    assert out["server_timing"] == {"infer_ms": 3.0}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (raw_array("|O", [1], b"\0" * 8), "dtype '|O' is not allowed (bool, integer or float "
         "arrays only)"),
        (raw_array("<V8", [1], b"\0" * 8), "dtype '<V8' is not allowed (bool, integer or float "
         "arrays only)"),
        (raw_array("<f4", [1000000, 1000000, 3], b"\0" * 12),
         "declared shape [1000000, 1000000, 3] of <f4 needs 12000000000000 bytes but the "
         "buffer holds 12"),
        (raw_array("|u1", [2, 2], b"\0" * 5), "declared shape [2, 2] of |u1 needs 4 bytes but "
         "the buffer holds 5"),
        (raw_array("|u1", [-1, -4], b"\0" * 4), "shape must be a list of at most 8 non-negative "
         "integers"),
        (raw_array("|u1", [1] * 9, b"\0"), "shape must be a list of at most 8 non-negative "
         "integers"),
        (raw_array("|u1", [4], "abcd"), "array data is not a byte string"),
        ({b"__npgeneric__": True, b"data": 300, b"dtype": "|u1"}, "scalar 300 does not fit |u1"),
    ],
)  # fmt: skip
def test_bad_arrays_become_bad_values_named_by_field(value, reason):
    out = unpack(frame(**{"observation/state": value, "prompt": "x"}))
    assert out["observation/state"] == BadValue(reason)
    assert find_bad(out) == ("observation/state", BadValue(reason))


def test_nested_bad_values_are_named_by_path():
    images = [raw_array("<f8", [1], b"\0" * 8), raw_array("|O", [1], b"\0" * 8)]
    out = unpack(frame(observation={"images": images}))
    assert out["observation"]["images"][0].tolist() == [0.0]
    assert find_bad(out)[0] == "observation/images[1]"


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"\xc1garbage", "frame: not a msgpack-numpy message (FormatError)"),
        (b"\x81\xa1a", "frame: not a msgpack-numpy message (ValueError)"),
        (msgpack.packb([1, 2]), "frame: expected a map of observation fields, got list"),
        (msgpack.packb({1: 2}), "frame: not a msgpack-numpy message (ValueError)"),
    ],
)
def test_malformed_frames_are_one_line(data, line):
    with pytest.raises(WireError) as exc:
        unpack(data)
    assert str(exc.value) == line


def test_pack_refuses_object_arrays():
    with pytest.raises(TypeError, match="cannot send an array of dtype object"):
        pack({"x": np.array([None], dtype=object)})
