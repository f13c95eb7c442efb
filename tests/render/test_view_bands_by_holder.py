"""The timeline's bands by holder: a training step on the fake PyTorch, whose parameters were
made before the trace, its gradients and optimizer state during it, activations freed in it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pytest
from fake_torch import FakeAdamW, FakeLinear, FakeSequential, FakeTorchMemory

from jupyter_gpumem.data.holders import FREED, HOLDER_BANDS, NO_HOLDER, holder_role
from jupyter_gpumem.render.trace_result import analyze
from jupyter_gpumem.render.view_payload import build_view, decode_column

if TYPE_CHECKING:
    from jupyter_gpumem.data.schema import Snapshot

MiB = 1 << 20


def _step(mem: FakeTorchMemory) -> tuple[Snapshot, dict[str, Any]]:
    """A snapshot whose trace is one step, and the namespace after it."""
    model = FakeSequential(FakeLinear(mem, 512, 512), None, FakeLinear(mem, 512, 64))
    opt = FakeAdamW(model.parameters())
    stray = mem.empty(2 * MiB)  # older than the trace, held by nothing once dropped
    mem._record_memory_history("all", stacks="python", clear_history=True)
    acts = [mem.empty(4 * MiB) for _ in range(3)]
    for p in model.parameters():
        p.grad = mem.empty(p.nbytes)
    del acts
    opt.step()
    loss = mem.empty(512)
    orphan = mem.empty(1 * MiB)  # made in the trace, held by no variable below
    snap = cast("Snapshot", mem._snapshot())
    mem._record_memory_history(None)
    ns = {"model": model, "opt": opt, "loss": loss}
    del stray, orphan  # the blocks stay live in the snapshot
    return snap, ns


def _bands(payload: dict[str, Any]) -> tuple[list[str], np.ndarray]:
    tl = payload["timeline"]
    return tl["band_labels"], np.array([decode_column(c) for c in tl["bands"]])


def test_bands_by_holder_in_order_and_summing_to_allocated() -> None:
    mem = FakeTorchMemory()
    snap, ns = _step(mem)
    t = analyze(snap, device=0, namespace=ns, bands="holder")
    payload = t.to_json()
    labels, values = _bands(payload)
    assert labels == list(HOLDER_BANDS)
    assert payload["timeline"]["bands_by"] == "holder"
    assert payload["timeline"]["band_sites"] == []
    allocated = decode_column(payload["timeline"]["allocated"])
    np.testing.assert_array_equal(values.sum(axis=0), allocated)
    size = {b["address"]: b["size"] for s in snap["segments"] for b in s["blocks"]}
    params = sum(size[p.data_ptr()] for p in ns["model"].parameters())
    at_end = values[:, -1]
    assert at_end[labels.index("parameters & buffers")] == params
    assert at_end[labels.index("gradients")] == params
    assert at_end[labels.index("optimizer state")] == 2 * params
    assert at_end[labels.index(FREED)] == 0
    assert values[labels.index(FREED)].max() == 12 * MiB


def test_empty_bands_are_left_out_and_the_band_column_is_their_membership() -> None:
    mem = FakeTorchMemory()
    snap, ns = _step(mem)
    ns = {"model": ns["model"]}  # no optimizer, no loss in the namespace
    t = analyze(snap, device=0, namespace=ns, bands="holder")
    payload = t.to_json()
    labels, values = _bands(payload)
    assert labels == ["parameters & buffers", "gradients", NO_HOLDER, FREED]
    _check_band_column(payload, values, t.holders)


@pytest.mark.parametrize("bands", ["site", "holder"])
def test_band_column_agrees_with_the_bands(bands: str) -> None:
    mem = FakeTorchMemory()
    snap, ns = _step(mem)
    t = analyze(snap, device=0, namespace=ns, bands=bands)  # type: ignore[arg-type]
    payload = t.to_json()
    _, values = _bands(payload)
    _check_band_column(payload, values, t.holders)


def _check_band_column(payload: dict[str, Any], values: np.ndarray,
                       held: Mapping[int, Sequence[str]]) -> None:
    """Every block life's band is the band its bytes are drawn in: by site, the band of its
    site (else "other"); by holder, "freed" for a life that ends in the trace, else the band of
    its holders' first role. At the end, each band is the sizes of its lives live then."""
    tl = payload["timeline"]
    blocks = {k: decode_column(v) for k, v in payload["lives"]["blocks"].items()}
    band = blocks["band"]
    assert band.dtype == np.int32 and band.min() >= 0 and band.max() < len(values)
    n = payload["n_events"]
    if tl["bands_by"] == "site":
        sites = tl["band_sites"]
        expected = [sites.index(s) if s in sites else len(sites) for s in blocks["site"]]
    else:
        labels = tl["band_labels"]
        expected = []
        for addr, end in zip(blocks["addr"], blocks["end"], strict=True):
            names = held.get(int(addr), [])
            role = (FREED if end < n else
                    min((holder_role(h) for h in names), key=HOLDER_BANDS.index, default=NO_HOLDER))
            expected.append(labels.index(role))
    np.testing.assert_array_equal(band, expected)
    live = blocks["end"] >= n
    for g in range(len(values)):
        assert blocks["size"][live & (band == g)].sum() == values[g, -1]


def test_build_view_takes_the_first_role_and_holders_of_older_blocks() -> None:
    mem = FakeTorchMemory()
    snap, ns = _step(mem)
    t = analyze(snap, device=0, namespace=ns)
    assert t.bands == "site"
    assert t.to_json()["timeline"]["bands_by"] == "site"
    # A gradient block also held by a plain variable (named first) counts as a gradient;
    # without the holders of older blocks the parameters are held by no variable.
    grad = next(b for b in t.surviving if any(h.endswith(".grad") for h in b.holders))
    aliased = [replace(b, holders=("alias", *b.holders)) if b is grad else b
               for b in t.surviving]
    payload = build_view(snap, device=0, surviving=aliased, bands="holder")
    labels, values = _bands(payload)
    assert "parameters & buffers" not in labels and NO_HOLDER in labels
    blocks = {k: decode_column(v) for k, v in payload["lives"]["blocks"].items()}
    at = np.flatnonzero(blocks["addr"] == grad.address)
    assert [labels[g] for g in blocks["band"][at]][-1] == "gradients"
    assert values[labels.index("gradients")][-1] > 0
    with pytest.raises(ValueError, match="bands must be one of"):
        build_view(snap, device=0, bands="cell")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bands must be one of"):
        analyze(snap, device=0, bands="cell")  # type: ignore[arg-type]


def test_the_picture_colours_by_holder_too() -> None:
    pytest.importorskip("matplotlib")
    mem = FakeTorchMemory()
    snap, ns = _step(mem)
    t = analyze(snap, device=0, namespace=ns, bands="holder")
    fig = t.figure()
    ax = fig.subfigs[0].axes[0]
    legend = [x.get_text() for x in ax.get_legend().get_texts()]
    assert legend[:len(HOLDER_BANDS)] == list(HOLDER_BANDS)
    ax = analyze(snap, device=0, namespace=ns).plot()  # by site: the allocating lines
    assert "gradients" not in [x.get_text() for x in ax.get_legend().get_texts()]
    with pytest.raises(ValueError, match="color_by must be"):
        t.plot(color_by="person")
