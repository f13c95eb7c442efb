from __future__ import annotations

from jupyter_gpumem.render.table import Table


def test_text_aligns_columns_and_leaves_no_trailing_spaces() -> None:
    t = Table(("name", "bytes", "note"), [("a", "1.0 KiB", "x"), ("bbb", "20 MiB", "")], "<><")
    assert t.text() == ("name    bytes  note\n"
                        "a     1.0 KiB  x\n"
                        "bbb    20 MiB")
    assert t.text(indent="  ", header=False) == "  a    1.0 KiB  x\n  bbb   20 MiB"


def test_html_escapes_every_cell() -> None:
    t = Table(("<h>", "b"), [("<script>", "a & b")], "<>", css_class='c"d')
    left, right = ' style="text-align: left"', ' style="text-align: right"'
    assert t.html() == (f'<table class="c&quot;d"><thead><tr><th{left}>&lt;h&gt;</th>'
                        f"<th{right}>b</th></tr></thead><tbody><tr><td{left}>&lt;script&gt;</td>"
                        f"<td{right}>a &amp; b</td></tr></tbody></table>")
