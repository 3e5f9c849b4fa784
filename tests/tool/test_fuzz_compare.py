"""The fuzzer's comparison (overlay/fuzz/compare.py), without engines."""

from overlay.fuzz import compare
from overlay.fuzz.compare import _logprob_problems, compare_request
from overlay.fuzz.configs import CONFIGS

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


def test_tokens_tied_with_the_sampled_one_may_rank_in_any_order():
    """Found by the long run of 2026-12-03 (0.34.0, preemption): logprobs=1, the sampled token 202
    at rank 1 alone in the overlay's row, at rank 3 beside token 201 (rank 1, the same value) in
    upstream's. Rows are sorted by token id, as the harness records them."""
    value = -1.1378294229507446
    overlay = [[202, value, 1]]
    upstream = [[201, value, 1], [202, value, 3]]
    assert _logprob_problems("lp", [overlay], [upstream], [202]) == []
    assert _logprob_problems("lp", [upstream], [overlay], [202]) == []
    # without the sampled tokens (prompt logprobs) nothing is dropped
    assert _logprob_problems("lp", [overlay], [upstream])
    # the sampled token's value and every entry at another value are still compared
    assert _logprob_problems("lp", [[[202, value + 0.5, 1]]], [upstream], [202])
    assert _logprob_problems("lp", [[[201, value + 0.5, 1], [202, value, 3]]], [upstream], [202])
    assert _logprob_problems("lp", [[[202, -1.0, 1]]], [[[201, -0.5, 1], [202, -1.0, 2]]], [202])
    wider = [[7, -2.0, 2], [201, value, 1], [202, value, 3]]
    assert _logprob_problems("lp", [wider], [[[7, -2.5, 2], [202, value, 1]]], [202])
    assert _logprob_problems("lp", [wider], [[[7, -2.0, 2], [202, value, 1]]], [202]) == []


def test_served_tokens_tied_with_the_sampled_one_may_be_listed_or_not():
    """Found by the served run of 2026-12-06 (JSON schema, logprobs=1): the sampled "\\n" alone in
    upstream's row, beside "\\t" (the same value: the tiny model's zero output rows) in the
    overlay's. Served rows name tokens by text, the sampled one by its text too."""
    value = -1.2601168155670166
    overlay = [["\t", value, None], ["\n", value, None]]
    upstream = [["\n", value, None]]
    assert _logprob_problems("lp", [overlay], [upstream], ["\n"]) == []
    assert _logprob_problems("lp", [upstream], [overlay], ["\n"]) == []
    assert _logprob_problems("lp", [overlay], [upstream])  # not without the sampled texts
    # another sampled text, another value, or an entry at another value: a difference
    assert _logprob_problems("lp", [overlay], [[["\t", value, None]]], ["\n"])
    assert _logprob_problems("lp", [overlay], [[["\n", value + 0.5, None]]], ["\n"])
    assert _logprob_problems("lp", [[*overlay, ["x", -3.0, None]]], [[*upstream, ["y", -2.0, None]]], ["\n"])
    completion = {"token_ids": [202], "text": "\n", "finish_reason": "length", "stop_reason": None}
    ours = {**completion, "logprobs": [overlay], "sampled_texts": ["\n"]}
    theirs = {**completion, "logprobs": [upstream], "sampled_texts": ["\n"]}
    assert compare._exact_problems({"outputs": [ours], "prompt_logprobs": None},
                                   {"outputs": [theirs], "prompt_logprobs": None}) == []  # fmt: skip


def test_served_top_k_tied_with_a_token_outside_the_row_above_the_sampled_one():
    """Found by the served run of 2026-12-06 (JSON schema, logprobs=1): top-1 was "\\n" in the
    overlay's row and "\\t" in upstream's (the same value), the sampled token listed below it."""
    overlay = [["\n", -0.9, None], ["s", -2.5, None]]
    upstream = [["\t", -0.9, None], ["s", -2.5, None]]
    assert _logprob_problems("lp", [overlay], [upstream], ["s"]) == []
    assert _logprob_problems("lp", [overlay], [upstream])  # not without the sampled texts
    # the value is still compared, and the sampled token's text
    assert _logprob_problems("lp", [overlay], [[["\t", -1.0, None], ["s", -2.5, None]]], ["s"])
    assert _logprob_problems("lp", [overlay], [[["\t", -0.9, None], ["u", -2.5, None]]], ["s"])
    # above the row's last top-k entry, tokens are compared
    wider = [["a", -0.5, None], ["\n", -0.9, None], ["s", -2.5, None]]
    assert _logprob_problems("lp", [wider], [[["b", -0.5, None], ["\t", -0.9, None], ["s", -2.5, None]]], ["s"])


def test_with_the_drafter_in_the_oracle_seeded_requests_with_drafts_are_compared_exactly(monkeypatch):
    """`fuzz --oracle-drafts`: the oracle drafts as the overlay does, so a drafter configuration's
    seeded random request must match token for token; without it only greedy ones can."""
    config = CONFIGS["eagle-N8"]
    request = {"params": {"temperature": 0.8, "seed": 3, "max_tokens": 4}}

    def result(token_ids: list[int]) -> dict:
        out = {"token_ids": token_ids, "text": "", "finish_reason": "length", "stop_reason": None, "logprobs": None}
        return {"aborted": False, "finished": True, "prompt_logprobs": None, "outputs": [out]}

    ours, theirs = result([5, 6]), result([5, 7])
    assert compare_request(config, request, ours, theirs)[0] == "structural"
    monkeypatch.setattr(compare, "ORACLE_DRAFTS", True)
    kind, problems = compare_request(config, request, ours, theirs)
    assert kind == "exact" and problems


def test_malformed_prompt_logprobs_of_upstream_are_not_held_against_the_overlay():
    """Found by the long run of 2026-12-04 (0.34.0, EAGLE windows, seed 9300 batch 23): a 1-token
    prompt whose upstream prompt logprobs had 4 rows (the overlay's: 1, as the API defines them).
    The rest of the request is still compared; rows the overlay gets wrong are still a failure."""
    config = CONFIGS["eagle-maxlen96-N4"]
    request = {"prompt": [243], "params": {"temperature": 0.0, "max_tokens": 2, "prompt_logprobs": 1}}

    def result(prompt_rows: int, token_ids: list[int]) -> dict:
        out = {"token_ids": token_ids, "text": "", "finish_reason": "length", "stop_reason": None, "logprobs": None}
        rows = [None] + [[[7, -1.0, 1]]] * (prompt_rows - 1)
        return {"aborted": False, "finished": True, "prompt_logprobs": rows, "outputs": [out]}

    kind, problems = compare_request(config, request, result(1, [24, 478]), result(4, [24, 478]))
    assert (kind, problems) == ("exact, upstream's prompt logprobs malformed", [])
    assert compare_request(config, request, result(1, [24, 479]), result(4, [24, 478]))[1]
    assert compare_request(config, request, result(4, [24, 478]), result(1, [24, 478]))[1]
    assert compare_request(config, request, result(1, [24, 478]), result(1, [24, 478])) == ("exact", [])


def test_a_served_run_cut_short_reports_the_batches_it_sent(monkeypatch):
    """Found by the long run of 2026-12-06: on a fresh checkout the fuzz command's environment had
    no `openai` client, the first served batch failed, and the report still counted all 332."""
    from overlay.fuzz import served

    def client_fails(server, batch, model):
        raise ModuleNotFoundError("No module named 'openai'")

    monkeypatch.setattr(served, "run_served", client_fails)
    report = served.served_batches({"overlay": None, "upstream": None}, seed=1, count=5)
    assert report["batches"] == 1
    assert len(report["failures"]) == 1 and "openai" in report["failures"][0]["problems"][0]


def test_the_commands_that_run_the_tests_support_install_its_requirements():
    """`fuzz` serves batches through the `openai` client (requirements/test.txt), as `test` does."""
    from overlay.bootstrap import wants_tests

    assert wants_tests(["fuzz", "--served", "3"]) and wants_tests(["--upstream", "0.34.0", "test"])
    assert not wants_tests(["build", "--upstream", "0.34.0"]) and not wants_tests(["export"])
