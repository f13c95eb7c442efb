"""AllocatorConfig: validation, the ``key:value,...`` form and JUPYTER_GPUMEM_ALLOC_CONF."""

from __future__ import annotations

import math

import pytest

from jupyter_gpumem import AllocatorConfig, CachingAllocator, SimulatedDevice

MiB = 1 << 20


def test_defaults_are_unset() -> None:
    c = AllocatorConfig()
    assert c.max_split_size_mb is None
    assert c.max_split_size is None
    assert c.roundup_power2_divisions is None
    assert c.garbage_collection_threshold is None
    assert c.per_process_memory_fraction is None
    assert c.as_text() == ""


def test_keyword_arguments_are_the_env_keys() -> None:
    c = AllocatorConfig(max_split_size_mb=64, roundup_power2_divisions=4,
                        garbage_collection_threshold=0.6, per_process_memory_fraction=0.5)
    assert c.max_split_size == 64 * MiB
    assert AllocatorConfig.parse(c.as_text()) == c


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_split_size_mb", 20),  # PyTorch: must be > 20
        ("max_split_size_mb", 0),
        ("max_split_size_mb", -64),
        ("roundup_power2_divisions", 3),
        ("roundup_power2_divisions", 0),
        ("roundup_power2_divisions", -4),
        ("roundup_power2_divisions", 2048),  # at most 1024
        ("roundup_power2_divisions", 2**54),  # 512 × divisions would overflow 64 bits
        ("max_split_size_mb", 2**30 + 1),  # at most 1 PiB
        ("max_split_size_mb", 2**43),  # in bytes it would overflow 64 bits
        ("garbage_collection_threshold", 0.0),  # strictly between 0 and 1
        ("garbage_collection_threshold", 1.0),
        ("garbage_collection_threshold", math.nan),
        ("per_process_memory_fraction", -0.01),
        ("per_process_memory_fraction", 1.01),
        ("per_process_memory_fraction", math.nan),
    ],
)
def test_bad_values_raise_value_error_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        AllocatorConfig(**{key: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_split_size_mb", 21), ("max_split_size_mb", 4096), ("max_split_size_mb", 2**30),
     ("roundup_power2_divisions", 1), ("roundup_power2_divisions", 16),
     ("roundup_power2_divisions", 1024), ("garbage_collection_threshold", 0.01),
     ("garbage_collection_threshold", 0.99), ("per_process_memory_fraction", 0.0),
     ("per_process_memory_fraction", 1.0), ("per_process_memory_fraction", 1)],
)
def test_boundary_values_are_accepted(key: str, value: object) -> None:
    assert getattr(AllocatorConfig(**{key: value}), key) == value  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_split_size_mb", True), ("max_split_size_mb", 64.0), ("roundup_power2_divisions", "4"),
     ("garbage_collection_threshold", "0.5"), ("per_process_memory_fraction", False)],
)
def test_wrong_types_raise_type_error_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(TypeError, match=key):
        AllocatorConfig(**{key: value})  # type: ignore[arg-type]


def test_parse() -> None:
    c = AllocatorConfig.parse(" max_split_size_mb : 64 , garbage_collection_threshold:0.6,,")
    assert c == AllocatorConfig(max_split_size_mb=64, garbage_collection_threshold=0.6)
    assert AllocatorConfig.parse("") == AllocatorConfig()
    assert AllocatorConfig.parse("per_process_memory_fraction:1") == AllocatorConfig(
        per_process_memory_fraction=1.0)


def test_updated_and_none_unsets_a_key() -> None:
    c = AllocatorConfig.parse("max_split_size_mb:64,roundup_power2_divisions:4")
    d = c.updated("max_split_size_mb:none")
    assert d == AllocatorConfig(roundup_power2_divisions=4)
    assert c.max_split_size_mb == 64  # frozen: the original is unchanged
    assert c.with_values(roundup_power2_divisions=None) == AllocatorConfig(max_split_size_mb=64)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("expandable_segments:true", "expandable_segments"),
        ("expandable_segments:1", "expandable_segments"),
        ("max_split_size_mb:abc", "max_split_size_mb"),
        ("max_split_size_mb:64.5", "max_split_size_mb"),
        ("max_split_size_mb:16", "max_split_size_mb"),
        ("roundup_power2_divisions:3", "roundup_power2_divisions"),
        ("garbage_collection_threshold:1.5", "garbage_collection_threshold"),
        ("garbage_collection_threshold:x", "garbage_collection_threshold"),
        ("per_process_memory_fraction:2", "per_process_memory_fraction"),
        ("max_split_size_mb", "max_split_size_mb"),
        ("max_split_size_mb:", "max_split_size_mb"),
    ],
)
def test_parse_errors_name_the_key(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        AllocatorConfig.parse(text)


def test_unknown_keyword_in_with_values() -> None:
    with pytest.raises(ValueError, match="nonsense"):
        AllocatorConfig().with_values(nonsense=1)


def test_from_env() -> None:
    env = {"JUPYTER_GPUMEM_ALLOC_CONF": "max_split_size_mb:128,per_process_memory_fraction:0.8"}
    assert AllocatorConfig.from_env(env) == AllocatorConfig(max_split_size_mb=128,
                                                            per_process_memory_fraction=0.8)
    assert AllocatorConfig.from_env({}) == AllocatorConfig()


def test_from_env_error_names_the_variable_and_the_key() -> None:
    env = {"JUPYTER_GPUMEM_ALLOC_CONF": "garbage_collection_threshold:7"}
    with pytest.raises(ValueError, match="JUPYTER_GPUMEM_ALLOC_CONF") as info:
        AllocatorConfig.from_env(env)
    assert "garbage_collection_threshold" in str(info.value)


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GPUMEM_ALLOC_CONF", "roundup_power2_divisions:8")
    assert AllocatorConfig.from_env().roundup_power2_divisions == 8


def test_allocator_takes_and_changes_its_config() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), AllocatorConfig(max_split_size_mb=64))
    assert a.config.max_split_size_mb == 64
    assert a.memory_stats()["max_split_size"] == 64 * MiB
    a.set_config(AllocatorConfig())
    assert a.memory_stats()["max_split_size"] == -1
    with pytest.raises(TypeError):
        a.set_config("max_split_size_mb:64")  # type: ignore[arg-type]


def test_changing_max_split_size_recounts_oversize_blocks() -> None:
    a = CachingAllocator(SimulatedDevice(1 << 30), debug=True)
    p = a.malloc(40 * MiB)
    assert a.memory_stats()["oversize_allocations.current"] == 0
    a.set_config(AllocatorConfig(max_split_size_mb=32))
    s = a.memory_stats()
    assert (s["oversize_allocations.current"], s["oversize_segments.current"]) == (1, 1)
    a.free(p)
    assert a.memory_stats()["oversize_allocations.current"] == 0
    a.set_config(AllocatorConfig())
    assert a.memory_stats()["oversize_segments.current"] == 0
