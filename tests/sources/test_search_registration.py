"""A source the registry makes tells the holder search its owners and the site naming its
library's files (``sources.registry``); a source whose owners are not ``Owner`` objects is not
made."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpumem import sources
from jupyter_gpumem.data import owners, sites
from jupyter_gpumem.data.owners import Owner
from jupyter_gpumem.sources.base import SourceBase


class Handle:
    def __init__(self, address: int) -> None:
        self.address = address


HANDLE = Owner("Handle", lambda t: t is Handle, lambda obj: (obj.address, 1))


class HandleSource(SourceBase):
    name = "handles"
    owners = (HANDLE,)
    library_files = ("/handlelib/",)


@pytest.fixture
def fresh():
    before = owners.registered()
    markers = sites.library_markers()[len(sites.LIBRARY_MARKERS):]
    yield
    for name in ("handles", "broken"):
        if name in sources.source_names():
            sources.unregister_source(name)
    owners.reset()
    owners.register(before)
    sites.reset_library_files()
    sites.register_library_files(markers)


def test_making_a_source_registers_its_owners_and_files(fresh) -> None:
    sources.register_source("handles", HandleSource)
    assert HANDLE not in owners.registered()  # registered, not made yet
    sources.get_source("handles")
    assert HANDLE in owners.registered()
    assert "/handlelib/" in sites.library_markers()


def test_a_source_with_bad_owners_is_not_made(fresh) -> None:
    class Broken(HandleSource):
        owners: Any = ("Handle",)

    sources.register_source("broken", Broken)
    with pytest.raises(sources.SourceError, match=r"source 'broken': its owners or "
                       r"library_files are not what a MemorySource gives \(TypeError: an owner "
                       r"is a jupyter_gpumem Owner"):
        sources.get_source("broken")
