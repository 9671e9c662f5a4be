"""Tests of dynamics.tasks.corpus: the standard-library corpus, its held-out files and windows."""

import numpy as np
import pytest

from dynamics import tasks
from dynamics.config import from_dict
from dynamics.tasks import corpus_info, data_hash, make_batch
from tests.test_tasks import cfg_for


def test_corpus_split_and_hash():
    info = corpus_info(0.1)
    assert set(info) == {"hash", "n_files", "n_train_files", "n_eval_files", "n_bytes", "root"}
    assert info["n_train_files"] + info["n_eval_files"] == info["n_files"] > 100
    assert 0.03 < info["n_eval_files"] / info["n_files"] < 0.2
    assert corpus_info(0.1)["hash"] == info["hash"] == data_hash(cfg_for("corpus"))
    names = list(tasks._corpus_files().names)
    assert names == sorted(names) and not any("site-packages" in n for n in names)
    assert all(n.endswith(".py") for n in names)
    held = tasks._held_out(tuple(names), 0.1)
    train = {n for n, h in zip(names, held, strict=True) if not h}
    held_names = {n for n, h in zip(names, held, strict=True) if h}
    assert train and held_names and not train & held_names
    # A larger holdout only adds files to the held-out set (hash threshold on the path).
    assert held_names <= {n for n, h in zip(names, tasks._held_out(tuple(names), 0.3), strict=True) if h}


def test_a_corpus_split_without_windows_is_a_config_error_before_any_batch():
    # Which files a holdout keeps depends on this machine's standard library, so config
    # validation passes these; tasks.check must refuse them, naming the key.
    import hashlib

    from dynamics.config import ConfigError

    names = tasks._corpus_files().names
    u = sorted(int.from_bytes(hashlib.sha256(n.encode()).digest()[:8], "big") / 2.0**64 for n in names)
    tasks.check(cfg_for("corpus"))
    with pytest.raises(ConfigError, match=r"^task\.holdout: .* no held-out \(eval and probe\) file"):
        tasks.check(cfg_for("corpus", holdout=u[0] / 2))
    with pytest.raises(ConfigError, match=r"^task\.holdout: .* no training file"):
        tasks.check(cfg_for("corpus", holdout=(u[-1] + 1) / 2))
    longest = int(tasks._corpus_files().lengths.max())
    with pytest.raises(ConfigError, match=r"^model\.context: .* too long for the corpus"):
        tasks.check(from_dict({"task": {"name": "mixture", "components": ["markov", "corpus"]},
                               "model": {"vocab_size": 256, "context": longest, "pos": "none"}}))


def test_a_standard_library_without_py_files_is_one_line_exit_2_before_any_store(tmp_path, monkeypatch):
    # A stripped install (or a root at an empty folder) raised RuntimeError from tasks.check:
    # a traceback from `dynamics run`. A fresh cache over the empty root; monkeypatch puts the
    # module's own cached corpus back afterwards, so other tests do not read it again.
    import functools

    from dynamics.cli import main
    from dynamics.config import ConfigError
    from dynamics.tasks import corpus

    empty = tmp_path / "lib"
    empty.mkdir()
    (empty / "README.txt").write_text("no python here\n")
    monkeypatch.setattr(corpus, "_stdlib_root", lambda: str(empty))
    monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
    message = f"task.name: the corpus task reads this Python's standard library, but no .py file was found under {empty}"
    with pytest.raises(ConfigError) as e:
        tasks.check(cfg_for("corpus"))
    assert str(e.value) == message
    config = tmp_path / "c.toml"
    config.write_text('[model]\nvocab_size = 256\ncontext = 16\n[task]\nname = "corpus"\n[train]\nsteps = 2\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out.zarr")]) == 2
    assert not (tmp_path / "out.zarr").exists()


def test_corpus_windows_are_substrings_of_the_right_split():
    cfg = cfg_for("corpus", context=64)
    corpus = tasks._corpus_files()
    held = tasks._held_out(corpus.names, cfg.task.holdout)
    by_split = {
        "train": [corpus.file(i) for i in np.flatnonzero(~held)],
        "eval": [corpus.file(i) for i in np.flatnonzero(held)],
    }
    for split, contents in by_split.items():
        b = make_batch(cfg, split, 0, 4)
        np.testing.assert_array_equal(b.tokens, make_batch(cfg, split, 0, 4).tokens)
        for row in b.tokens:
            window = bytes(row.astype(np.uint8))
            assert any(window in c for c in contents), split
    probe = make_batch(cfg, "probe", 0, 2)
    for row in probe.tokens:
        assert any(bytes(row.astype(np.uint8)) in c for c in by_split["eval"])


def test_a_standard_library_directory_that_cannot_be_listed_is_refused_not_skipped(tmp_path, monkeypatch):
    # os.walk skips a directory it cannot list unless told otherwise: the corpus was then made of
    # the rest, in silence, under a content hash of its own. A root that is not there is the one
    # listing failure a root process meets here; the same handler names an unreadable folder.
    import functools

    from dynamics.config import ConfigError
    from dynamics.tasks import corpus

    gone = tmp_path / "lib"
    monkeypatch.setattr(corpus, "_stdlib_root", lambda: str(gone))
    monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
    with pytest.raises(ConfigError) as e:
        tasks.check(cfg_for("corpus"))
    assert str(e.value) == (f"task.name: the corpus task cannot list the standard-library directory {gone}: "
                            f"No such file or directory")


def test_corpus_window_starts_are_uniform_over_every_valid_start(tmp_path, monkeypatch):
    # A tiny standard library whose every byte says where it is: a window's first byte is its
    # start. 50 + 30 valid starts of 11-byte windows, each drawn 1/80 of the time, the first and
    # the last of each file included (a start pinned to 0, or an off-by-one at the end, failed).
    import functools

    from dynamics.tasks import corpus

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.py").write_bytes(bytes(range(0, 60)))
    (lib / "b.py").write_bytes(bytes(range(100, 140)))
    monkeypatch.setattr(corpus, "_stdlib_root", lambda: str(lib))
    monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
    windows = corpus._corpus(np.random.default_rng(0), 40_000, 11, 0.0, "train")  # (n, 11)
    first = windows[:, 0]
    assert (windows - first[:, None] == np.arange(11)[None, :]).all()  # inside one file
    starts = sorted(set(range(0, 50)) | set(range(100, 130)))
    counts = np.array([(first == s).sum() for s in starts])
    assert counts.sum() == 40_000  # no start outside those
    assert np.abs(counts / 40_000 - 1 / 80).max() < 0.003  # 5 standard deviations of a share of 1/80


def test_files_the_install_writes_are_not_corpus(tmp_path, monkeypatch):
    # _sysconfigdata_*.py and config-*/python-config.py hold the install prefix and the build's
    # temporary directory: two installs of one CPython version, differing only there, made
    # different corpus bytes, so different data (and a resume refused as another stdlib).
    import functools

    from dynamics.tasks import corpus

    def stdlib(root, prefix):
        (root / "config-3.11-x86_64-linux-gnu").mkdir(parents=True)
        (root / "pkg").mkdir()
        (root / "a.py").write_text("import os\n" * 20)
        (root / "pkg" / "config-like.py").write_text("x = 1\n" * 20)  # a source file named like it stays
        (root / "pkg" / "_sysconfigdata_x.py").write_text("y = 2\n" * 20)  # below the root: source
        (root / "_sysconfigdata__linux_x86_64-linux-gnu.py").write_text(f"build_time_vars = {{'prefix': {prefix!r}}}\n")
        (root / "config-3.11-x86_64-linux-gnu" / "python-config.py").write_text(f"#!{prefix}/bin/python3.11\n")

    hashes = []
    for name, prefix in (("one", "/root/.pyenv/versions/3.11.7"), ("two", "/usr/local")):
        stdlib(tmp_path / name, prefix)
        monkeypatch.setattr(corpus, "_stdlib_root", lambda name=name: str(tmp_path / name))
        monkeypatch.setattr(corpus, "_corpus_files", functools.lru_cache(maxsize=1)(corpus._corpus_files.__wrapped__))
        monkeypatch.setattr(corpus, "_corpus_hash", functools.lru_cache(maxsize=1)(corpus._corpus_hash.__wrapped__))
        assert corpus._corpus_files().names == ("a.py", "pkg/_sysconfigdata_x.py", "pkg/config-like.py")
        hashes.append(corpus._corpus_hash())
    assert hashes[0] == hashes[1]


def test_a_window_as_long_as_the_longest_file_of_a_side_is_accepted_and_drawn():
    # check_corpus refuses a window no file holds: at exactly the longest file's length on the
    # side whose longest file is shorter, that file holds one window, and it is the one drawn
    from dynamics.tasks.corpus import _corpus, _corpus_files, _held_out, check_corpus

    c = _corpus_files()
    held = _held_out(c.names, 0.1)
    L = int(min(c.lengths[held].max(), c.lengths[~held].max()))
    assert check_corpus(0.1, L) is None and "too long for the corpus" in check_corpus(0.1, L + 1)
    split = "eval" if c.lengths[held].max() == L else "train"
    windows = _corpus(np.random.default_rng(0), 2, L, 0.1, split)  # (2, L): the one window there is
    longest = np.flatnonzero((held == (split != "train")) & (c.lengths == L))[0]
    assert windows.shape == (2, L) and bytes(windows[0].astype(np.uint8)) == bytes(windows[1].astype(np.uint8)) \
        == c.file(longest)
