"""Every example in the package's docstrings runs as written: its ``>>>`` lines give the output
shown. Those marked ``+SKIP`` need a store or a trained run. The examples are a reader's first
account of a function (help(), an editor's hover), and nothing ran them, so one could go stale
unseen."""

import doctest
import importlib
import pkgutil

import pytest

import dynamics

MODULES = sorted(m.name for m in pkgutil.walk_packages(dynamics.__path__, "dynamics.")
                 if not m.name.endswith("__main__"))  # importing it is harmless, but it has no examples


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run_as_written(name):
    failed, _ = doctest.testmod(importlib.import_module(name))
    assert failed == 0, f"{name}: {failed} docstring example(s) give other output (printed above)"


def test_the_examples_are_found():
    # a finder that found nothing would pass every module above
    found = sum(len([e for e in t.examples if not e.options.get(doctest.SKIP)])
                for name in MODULES for t in doctest.DocTestFinder().find(importlib.import_module(name)))
    assert found >= 100, found
