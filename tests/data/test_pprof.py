"""The pprof reader (``data.pprof``): the memory profile JAX 0.11 wrote on an H200 (the
live buffers and compiled executables of a small script, run with
``XLA_PYTHON_CLIENT_ALLOCATOR=platform``; the default allocator's profile has the same shape),
one encoded by protobuf's rules in ``fake_jax``, and bytes that are no profile."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from fake_jax import encode_profile, traceback_at

from jupyter_gpumem.data.pprof import ProfileError, read_profile

H200_PROFILE = Path(__file__).resolve().parents[1] / "sources" / "fixtures" / (
    "jax_h200_memory_profile.pb.gz")


def test_the_h200_profile() -> None:
    profile = read_profile(H200_PROFILE.read_bytes())
    assert profile.sample_types == (("allocations", "count"), ("space", "bytes"))
    buffers = profile.buffers("cuda:0")
    # the script's arrays: x = ones(2**20) on line 13; a params dict on line 14 (a 1024×1024
    # and a 1024 zeros, a 256×256 and a 3 ones); a jitted sum on line 27
    assert sorted((s.bytes, s.count, s.frames[-1]["line"]) for s in buffers) == [
        (4, 1, 27), (12, 1, 14), (4096, 1, 14), (262144, 1, 14), (4194304, 1, 13),
        (4194304, 1, 14)]
    assert {s.frames[-1]["name"] for s in buffers} == {"<module>"}
    inner = buffers[0].frames[0]
    assert (inner["name"], inner["line"]) == ("__call__", 420)
    assert inner["filename"].endswith("/site-packages/jax/_src/interpreters/pxla.py")
    executables = [s for s in profile.samples if s.kind == "executable"]
    assert len(executables) == 7 and {s.bytes for s in executables} == {0}
    assert all("device" not in s.labels for s in executables)


def test_a_profile_encoded_by_protobuf_s_rules() -> None:
    tb = traceback_at("/home/me/train.py", 12)
    data = gzip.compress(encode_profile([(tb, 4096, "cuda:1"), (tb, 1 << 40, "cuda:1")]))
    profile = read_profile(data)
    assert [(s.bytes, s.count, s.labels) for s in profile.samples] == [
        (4096, 1, {"kind": "buffer", "device": "cuda:1"}),
        (1 << 40, 1, {"kind": "buffer", "device": "cuda:1"})]
    assert profile.samples[0].frames[-1] == {"filename": "/home/me/train.py", "line": 12,
                                             "name": "<module>"}
    assert read_profile(gzip.decompress(data)) == profile  # uncompressed reads the same
    assert profile.buffers("cuda:0") == []


@pytest.mark.parametrize(("data", "message"), [
    (b"\x1f\x8bnot gzip", "not a gzip stream"),
    (b"\x12\x05ab", "field 2 runs past the end, at byte 2"),
    (b"\x0f", "wire type 7 of field 1 is not protobuf's"),
    (b"\x08\xff\xff", "a number runs past the end, at byte 3"),
])
def test_bytes_that_are_no_profile(data: bytes, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        read_profile(data)
