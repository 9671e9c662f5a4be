"""The report folder: refused where the report's files would mix into another tool's data."""

import pytest

from dynamics.usage import UsageError, check_report_dir


@pytest.mark.parametrize("marker", ["zarr.json", ".zgroup", ".zarray"])
def test_a_zarr_store_of_either_format_is_no_report_folder(tmp_path, marker):
    # a zarr v2 group or array is as much another tool's store as a v3 one
    out = tmp_path / "foreign.zarr"
    out.mkdir()
    (out / marker).write_text('{"zarr_format": 2}')
    with pytest.raises(UsageError, match=f"^--out {out} is a zarr store; give the report a folder of its own$"):
        check_report_dir(out, "--out")
    assert sorted(p.name for p in out.iterdir()) == [marker]


def test_a_new_or_empty_folder_is_a_report_folder(tmp_path):
    check_report_dir(tmp_path / "new", "--out")
    (tmp_path / "empty").mkdir()
    check_report_dir(tmp_path / "empty", "--out")
    assert not (tmp_path / "new").exists()  # checked, not made
