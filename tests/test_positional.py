"""Voita et al.'s positional-head rule: the share of rows peaking at an offset."""

import numpy as np
import pytest

from dynamics.analysis.positional import VOITA_PEAK, peak_share
from dynamics.analysis.slash import slash_score
from tests.test_slash import as_attention, diagonal, uniform


def test_peak_share_counts_rows_peaking_at_the_offset_not_the_weight_there():
    t = 12
    weak = 0.3 * diagonal(t, 1) + 0.7 * uniform(t)  # peaks one step back in every row, holding 0.43 there
    sink = np.zeros((t, t))
    sink[:, 0] = 1
    tie = uniform(t).copy()
    tie[2:, :] = 0
    tie[2:, 0] = tie[2:, 1] = 0.5  # rows from 2 split between keys 0 and 1: one back in row 2, tied there
    a = np.stack([diagonal(t, 1), weak, uniform(t), sink, tie, np.full((t, t), np.nan)])[None, None, :, None]
    attn = as_attention(a.astype(np.float16))
    share = peak_share(attn).values.ravel()
    # rows 2..11 are the rule's: row 1's key one back is the first token, where a sink head peaks
    # (counted, it met the rule at T = 2); a tie is no peak, so uniform rows and the tied head's
    # row 2 count nowhere
    np.testing.assert_allclose(share[:5], [1.0, 1.0, 0.0, 0.0, 0.0])
    assert np.isnan(share[5])  # a padded head: undefined, not a miss
    assert VOITA_PEAK == 0.9 and share[1] >= VOITA_PEAK
    assert slash_score(attn).sel(offset=1).isel(head=1).item() < 0.5  # what the previous_token role asks
    assert peak_share(attn, delta=0).values.ravel()[3] == 0  # sink: key 0 is the self key of row 0 only, not counted
    for chunks in ({"head": 2}, {"probe": 1, "query": 5, "key": 7}):  # dask, chunked along any dim
        np.testing.assert_array_equal(peak_share(attn.chunk(chunks)).values, peak_share(attn).values)
    two = as_attention(np.stack([diagonal(2, 1), np.eye(2)[[0, 0]]])[None, None, :, None])
    assert np.isnan(peak_share(two).values).all()  # T = 2: no row counted, a sink head no positional head
    with pytest.raises(ValueError, match="delta"):
        peak_share(attn, delta=t)


def test_a_head_peaking_one_back_in_exactly_the_voita_share_of_rows_counts():
    # Voita et al.'s rule is inclusive: a peak share of exactly 0.9 meets it (a mutation audit's
    # `>` survived the module's tests, caught only by the report's)
    from dynamics.analysis.positional import missed_previous_token

    assert VOITA_PEAK == 0.9
    assert missed_previous_token([0.9, 0.9], [8, 0]) == 1  # role none counts, previous_token does not
    assert missed_previous_token([0.8999], [8]) == 0
