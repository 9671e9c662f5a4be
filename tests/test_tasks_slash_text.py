"""Tests of dynamics.tasks.slash_text: records, their field tree and their weights."""

import datetime
import re

import numpy as np

from dynamics import tasks
from dynamics.tasks import make_batch
from tests.test_tasks import cfg_for


def check_slash_record(rec, tree, hosts):
    if m := re.fullmatch(r"(\d{4})/(\d{2})/(\d{2})", rec):
        datetime.date(*map(int, m.groups()))  # raises if the day is invalid for the month
        return "date"
    if m := re.fullmatch(r"(\d+)/(\d+)", rec):
        a, b = map(int, m.groups())
        assert 1 <= a < b
        return "fraction"
    if rec.startswith("https://"):
        host, *parts = rec[len("https://") :].split("/")
        assert host in hosts and parts
        parent = f"https://{host}"
        kind = "url"
    else:
        assert rec.startswith("/")
        parent, parts, kind = "", rec[1:].split("/"), "path"
    for part in parts:  # each field is a child of the field before
        assert part in tree[parent], (rec, parent, part)
        parent = f"{parent}/{part}"
    return kind


def test_slash_text_fields_depend_on_previous_field():
    cfg = cfg_for("slash_text", context=96)
    b = make_batch(cfg, "train", 0, 32)
    assert b.tokens.max() < 256
    tree, hosts = tasks._slash_tree()
    kinds = set()
    for row in b.tokens:
        text = bytes(row.astype(np.uint8)).decode("ascii")
        assert "/" in text
        records = re.split(r"[ \n]", text)[:-1]  # the last record may be cut
        for rec in records:
            kinds.add(check_slash_record(rec, tree, hosts))
    assert kinds == {"date", "fraction", "path", "url"}


def test_slash_text_month_determines_days():
    # All 29 Februaries that exist are leap years; no day beyond its month's length exists.
    pool = tasks._slash_records()["date"]
    assert "2000/02/29" in pool and "2001/02/29" not in pool and "1999/04/31" not in pool
    assert len(pool) == (datetime.date(2030, 1, 1) - datetime.date(1990, 1, 1)).days


def test_slash_text_separators_and_record_kinds_follow_their_weights():
    # " " with probability 0.7, else "\n"; kinds path, url, date, fraction with 0.3, 0.2, 0.25,
    # 0.25 per record. Only each row's first 5 records are counted: at most 45 bytes each with
    # their separator, they always fit in the row's 256, while a row's cut last record is more
    # often a long one (a path or url). 10,240 records: standard deviations under 0.005.
    tree, hosts = tasks._slash_tree()
    records, seps = [], []
    for row in make_batch(cfg_for("slash_text", context=255), "train", 0, 2048).tokens:
        text = bytes(row.astype(np.uint8)).decode("ascii")
        records += re.split(r"[ \n]", text)[:5]
        seps += [c for c in text if c in " \n"][:5]
    assert abs(seps.count(" ") / len(seps) - 0.7) < 0.02
    kinds = [check_slash_record(r, tree, hosts) for r in records]
    for kind, weight in zip(("path", "url", "date", "fraction"), (0.3, 0.2, 0.25, 0.25), strict=True):
        assert abs(kinds.count(kind) / len(kinds) - weight) < 0.02, kind


def test_slash_text_fractions_are_the_proper_ones_up_to_64():
    # a/b for 1 <= a < b <= 64: sum over b of (b - 1) = 63 * 64 / 2 = 2016 of them.
    pool = tasks._slash_records()["fraction"]
    assert len(pool) == 2016 and len(set(pool)) == 2016
    assert all(int(a) < int(b) <= 64 for a, b in (f.split("/") for f in pool))
