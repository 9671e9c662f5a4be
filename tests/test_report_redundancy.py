"""The redundancy section: what the dendrogram's caption says when the stored JS distances
cannot be read."""

from __future__ import annotations

import html
import shutil

from dynamics.report import write_report
from tests._report_store import _flip


def test_js_distances_failing_their_checksum_are_recomputed_and_the_caption_says_so(built, tmp_path):
    # The runs table reads no JS distances, so it said "stored by `dynamics analyse`" while the
    # dendrogram was recomputed from the recordings without a word
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    _flip(copy / "analysis" / ids["A"] / "js_distance" / "c")
    damaged: list[str] = []
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=ids["A"], on_damaged_data=damaged.append).read_text())
    assert damaged == [f"run {ids['A']}: its stored analysis could not be read (a chunk failed its checksum)"]
    assert f"Run {ids['A']} at step" in text and ", analysed for this report, its stored analysis could not be read. " in text
