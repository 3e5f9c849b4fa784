"""The fuzzer's logprob comparison (tests/support/fuzz.py), without engines."""

from support.fuzz import _logprob_problems

# One position, logprobs=2: (token id, logprob, rank) per entry, as the harness records rows.
ROW = [[224, -0.16894254088401794, 1], [205, -3.0856964588165283, 2]]


def test_a_tie_at_the_rows_last_rank_with_a_token_outside_it_is_no_difference():
    """Found by the long run of 2026-12-02 (Qwen3 N = 8, structured output): tokens 205 and
    202 have the same logprob; each build listed one of them at rank 2."""
    other = [[224, -0.16894254088401794, 1], [202, -3.0856964588165283, 2]]
    assert _logprob_problems("lp", [ROW], [other]) == []


def test_a_different_value_or_a_different_token_above_the_last_rank_is_a_difference():
    assert _logprob_problems("lp", [ROW], [[[224, -0.16894254088401794, 1], [205, -3.2, 2]]])
    assert _logprob_problems("lp", [ROW], [[[223, -0.16894254088401794, 1], [205, -3.0856964588165283, 2]]])
    wider = [[224, -0.1, 1], [205, -3.0, 2], [7, -4.0, 3]]
    assert _logprob_problems("lp", [wider], [[[224, -0.1, 1], [206, -3.0, 2], [7, -4.0, 3]]])


def test_served_rows_without_ranks_tie_at_their_lowest_value():
    """Through the server a row is the OpenAI response's top logprobs: (token, value, None)."""
    ours = [["a", -0.5, None], ["b", -2.0, None]]
    assert _logprob_problems("lp", [ours], [[["a", -0.5, None], ["c", -2.0, None]]]) == []
    assert _logprob_problems("lp", [ours], [[["c", -0.5, None], ["b", -2.0, None]]])
