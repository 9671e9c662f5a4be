"""dynamics.paths: a path with ``..`` after a symbolic link, read as the kernel reads it, by known answers."""

import os
from pathlib import Path

from dynamics import store
from dynamics.cli import default_report_dir
from dynamics.paths import absolute
from tests.conftest import TINY, cli_in_process


def _tree(tmp_path):
    """tmp/work/lnk -> tmp/elsewhere/sub, so that work/lnk/.. is tmp/elsewhere to the kernel."""
    root = tmp_path.resolve()
    (root / "elsewhere" / "sub").mkdir(parents=True)
    (root / "work").mkdir()
    (root / "work" / "lnk").symlink_to("../elsewhere/sub")
    return root


def test_a_dotdot_after_a_link_goes_up_from_its_target_and_the_rest_is_kept(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    assert absolute(root / "work" / "lnk" / ".." / "s.zarr") == root / "elsewhere" / "s.zarr"
    assert os.path.abspath(root / "work" / "lnk" / ".." / "s.zarr") == str(root / "work" / "s.zarr")  # as text
    monkeypatch.chdir(root / "work")
    assert absolute("lnk/../x/y.zarr") == root / "elsewhere" / "x" / "y.zarr"
    assert absolute("plain/./s.zarr") == root / "work" / "plain" / "s.zarr"  # nothing to resolve: as given
    (root / "work" / "s.zarr").symlink_to(root / "elsewhere")  # a store that is a link keeps its own name
    assert absolute("s.zarr") == root / "work" / "s.zarr"
    assert absolute("lnk/../../work/s.zarr") == root / "work" / "s.zarr"  # only up to the last `..`


def test_a_store_named_through_a_link_and_dotdot_is_one_store_to_every_command(tmp_path):
    # `run` wrote to elsewhere/s.zarr (the kernel's reading), xarray read work/s.zarr (abspath's):
    # analyse failed on every run, a sweep into the same --out made a second store
    root = _tree(tmp_path)
    cfg = root / "tiny.toml"
    cfg.write_text(TINY.format(steps=10, every=5))
    done = cli_in_process("run", str(cfg), "--out", "lnk/../s.zarr", cwd=root / "work")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(root / "elsewhere")) == ["s.zarr", "sub"] and os.listdir(root / "work") == ["lnk"]
    done = cli_in_process("analyse", "lnk/../s.zarr", "--workers", "1", cwd=root / "work")
    assert done.returncode == 0, done.stderr
    dotted = str(root / "work" / "lnk" / ".." / "s.zarr")
    (rid,) = store.list_runs(dotted)
    assert int(store.open_run(dotted, rid).step[-1]) == 10
    assert store.open_analysis(dotted, rid) is not None
    assert default_report_dir(dotted) == root / "elsewhere" / "s-report"
    # the report's reader of derived groups in folders (an older layout) went by xarray's text path
    import xarray as xr

    from dynamics.report.data import _derived_names, _open_derived

    folder = root / "elsewhere" / "s.zarr" / "derived" / "folder"
    xr.Dataset().to_zarr(folder, zarr_format=3, consolidated=False)
    xr.Dataset({"v": ("x", [1.0])}).to_zarr(folder / "x", zarr_format=3, consolidated=False)
    assert "folder/x" in _derived_names(dotted)
    assert float(_open_derived(dotted, "folder/x").v[0]) == 1.0
    # `..` after a folder still to be made: the kernel finds nothing there, so the store is made
    # with it (as before) and read where the kernel reads it, not where realpath would put it
    done = cli_in_process("run", str(cfg), "--out", "new/../t.zarr", cwd=root / "work")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(root / "work")) == ["lnk", "new", "t.zarr"]
    assert cli_in_process("status", "new/../t.zarr", cwd=root / "work").returncode == 0
    assert default_report_dir("runs/q.zarr") == default_report_dir("runs/./q.zarr") == Path("runs/q-report")
