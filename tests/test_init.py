"""The package's top level: what ``import dynamics`` gives a notebook."""

import re
from pathlib import Path

import pytest

import dynamics

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_dotted_name_the_readme_shows_resolves_after_a_plain_import():
    # `dynamics.checkpoint.load_run_model(...)` after `import dynamics` raised AttributeError: a package's
    # submodules are attributes only once something imports them. Module __getattr__ is called
    # directly, as a fresh process would reach it, since this test process imported them already.
    names = sorted(set(re.findall(r"\bdynamics\.([a-z_]+)\.([A-Za-z_][\w.]*)", README.read_text())))
    assert ("checkpoint", "load_run_model") in names
    for module, attr in names:
        obj = dynamics.__getattr__(module)
        for part in attr.split("."):
            obj = getattr(obj, part)


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dynamics.__getattr__("nope")


def test_every_top_level_name_the_readme_shows_is_there():
    # README showed `dynamics.StaleAnalysisWarning`, which lived only in dynamics.store, and named
    # `open_derived` beside `dynamics.open_analysis` while only dynamics.store had it.
    names = set(re.findall(r"\bdynamics\.([A-Za-z_]\w*)", README.read_text()))
    assert {"StaleAnalysisWarning", "StoreError", "check_recorded", "open_run", "open_derived"} <= names
    for name in names:
        dynamics.__getattr__(name)


def test_dir_lists_the_lazy_names_for_tab_completion():
    # a module __getattr__ without __dir__: IPython offered none of open_run, load_config, analysis
    import dynamics

    names = dir(dynamics)
    assert {"open_run", "open_sweep", "load_config", "analysis", "store", "__version__"} <= set(names)
    assert names == sorted(names) and "_EXPORTS" in names  # the module's own globals stay
