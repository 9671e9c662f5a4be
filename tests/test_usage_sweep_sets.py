"""A --set that a [sweep] axis replaces at every point of the grid is refused before any work."""

import re
from pathlib import Path

import pytest

from dynamics.config import load_config
from dynamics.usage import UsageError, check_not_swept

TEMPLATES = Path(__file__).resolve().parents[1] / "experiments" / "templates.toml"
ONE_TEMPLATE = '{ weight = %s, schedule = "constant", heads = [{ layer = 0, head = 0, pattern = "previous_token" }] }'


def _refused(config: Path, override: str, line: str) -> None:
    # as `sweep` and `demo` check it, on the config the --set was applied to; called directly, a
    # check that let it through fails here instead of training the grid
    with pytest.raises(UsageError, match=f"^{re.escape(line)}$"):
        check_not_swept(load_config(config, [override]), [override])


def test_a_key_inside_a_swept_table_is_refused(tmp_path):
    # the axis sets the whole intervene.templates table at each point: the weight asked for was dropped
    cfg = tmp_path / "table_axis.toml"
    cfg.write_text(TEMPLATES.read_text().replace(
        '"intervene.templates.weight" = [0.0, 1.0]',
        f'"intervene.templates" = [{ONE_TEMPLATE % "0.0"}, {ONE_TEMPLATE % "1.0"}]'))
    _refused(cfg, "intervene.templates.weight=0.5",
             "--set intervene.templates.weight: inside the [sweep] axis intervene.templates, whose values replace it "
             "at every point of the grid; to change them, --set 'sweep.intervene.templates=[...]'")


def test_a_table_set_whole_holding_a_swept_key_is_refused():
    _refused(TEMPLATES, "intervene.templates={weight=0.5}",
             "--set intervene.templates: its weight is the [sweep] axis intervene.templates.weight, which every point "
             "of the grid sets; to change its values, --set 'sweep.intervene.templates.weight=[...]'")


@pytest.mark.parametrize("override", [
    "intervene.templates={schedule='constant'}",  # the table holds no swept key: taken as given
    "train.lr=0.001",
])
def test_a_set_no_axis_replaces_is_not_refused_as_swept(override):
    check_not_swept(load_config(TEMPLATES, [override]), [override])
