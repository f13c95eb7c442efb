"""Changing the allocator's options from a notebook while blocks are live (the hardening issue)."""

from __future__ import annotations

from jupyter_gpumem.notebook.extension import get_extension


def test_lowering_max_split_at_run_time_keeps_the_books_true(shell, run, sim) -> None:
    # A 100 MiB segment split by a 3 MiB block leaves a 97 MiB cached piece; lowering
    # max_split_size to 64 MiB makes that piece oversize. Asking for more than the device has
    # then runs the retry ladder, which must give back only whole segments.
    assert run("%load_ext jupyter_gpumem")[0].success
    get_extension(shell).settings.live_view = False
    assert run("%gpumem device sim --capacity 256MiB")[0].success
    assert run("import jupyter_gpumem as g\nMiB = 1 << 20\na = g.get_allocator()\n"
               "p = a.malloc(100 * MiB); a.free(p); q = a.malloc(3 * MiB)")[0].success
    assert run("%gpumem config max_split_size_mb:64")[0].success
    result, _ = run("a.malloc(200 * MiB)")
    assert type(result.error_in_exec).__name__ == "OutOfMemoryError"
    a = shell.user_ns["a"]
    assert a.memory_reserved() == a.device.used == 100 << 20  # the books match the device
    assert a.memory_allocated() == 3 << 20
    assert run("a.free(q)\na.empty_cache()")[0].success
    assert a.memory_reserved() == a.device.used == 0
