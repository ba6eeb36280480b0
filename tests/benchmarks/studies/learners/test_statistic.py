"""The study's statistic (``benchmarks.studies.learners.study``) on made-up run records, against hand
computations: the pooled spreads between rows and within a row, Kruskal–Wallis H by the
textbook formula, and the identical-translation shares."""

from __future__ import annotations

import math

import pytest

from benchmarks.studies.learners.study import identical_shares, metric_statistic, study_table


def record(variant: str, control: int, value: float, texts: tuple[str, ...] = ("a", "b"),
           seed: int = 0) -> dict:
    return {"variant": variant, "seed": seed, "control": control, "valid_loss": value,
            "bleu": {"1": value + 10, "4": 2 * value}, "translations": {"1": list(texts), "4": list(texts)}}


# 3 rows x 3 runs (controls 0, 1, 2 of seed 0): A 1 2 3, B 4 5 6, C 7 8 9
VALUES = {"A": (1.0, 2.0, 3.0), "B": (4.0, 5.0, 6.0), "C": (7.0, 8.0, 9.0)}
RECORDS = [record(row, control, value)
           for row, values in VALUES.items() for control, value in enumerate(values)]


def test_spreads_and_kruskal_against_a_hand_computation():
    s = metric_statistic(RECORDS, "valid_loss")
    # within: each row's controls 1, 2, 3 (+3k): sample variance 1 -> pooled SD 1
    assert s.within == pytest.approx(1.0, abs=1e-12)
    # between: at control k the rows' values k+1, k+4, k+7: sample variance 9 -> pooled SD 3
    assert s.between == pytest.approx(3.0, abs=1e-12)
    # H = 12 / (n (n + 1)) * sum(R_i^2 / n_i) - 3 (n + 1), ranks 1..9: sums 6, 15, 24
    h = 12 / (9 * 10) * (6 ** 2 / 3 + 15 ** 2 / 3 + 24 ** 2 / 3) - 3 * 10
    assert h == pytest.approx(7.2)
    assert s.h == pytest.approx(h, rel=1e-12)
    assert s.p_value == pytest.approx(math.exp(-h / 2), rel=1e-9)  # chi-squared, 2 degrees of freedom
    assert s.epsilon_squared == pytest.approx(h / 8, rel=1e-12)
    # Friedman, blocks = controls 0, 1, 2 of seed 0: A < B < C in each, ranks 1 2 3, sums 3 6 9;
    # Q = 12 / (n k (k + 1)) * sum(R_j^2) - 3 n (k + 1) with n = 3 blocks, k = 3 rows
    q = 12 / (3 * 3 * 4) * (3 ** 2 + 6 ** 2 + 9 ** 2) - 3 * 3 * 4
    assert q == pytest.approx(6.0)
    assert s.friedman_q == pytest.approx(q, rel=1e-12)
    assert s.friedman_p == pytest.approx(math.exp(-q / 2), rel=1e-9)  # chi-squared, 2 degrees of freedom
    assert s.kendall_w == pytest.approx(q / (3 * 2), rel=1e-12)  # 1: the same order in every block


def test_friedman_ranks_within_blocks_so_seed_spread_does_not_hide_a_row():
    """Two seeds far apart (values +100 at seed 1) with the rows' order the same in each block:
    Kruskal–Wallis, pooling the seeds, misses the row effect at 5%; Friedman, blocking on them,
    finds it."""
    order = {"A": 0.0, "B": 0.1, "C": 0.2}
    records = [record(row, control, 100.0 * seed + offset + 0.01 * control, seed=seed)
               for seed in (0, 1) for control in (0, 1) for row, offset in order.items()]
    s = metric_statistic(records, "valid_loss")
    # KW over the 12 pooled values: ranks A 1 2 7 8, B 3 4 9 10, C 5 6 11 12 -> sums 18 26 34
    h = 12 / (12 * 13) * (18 ** 2 + 26 ** 2 + 34 ** 2) / 4 - 3 * 13
    assert s.h == pytest.approx(h, rel=1e-12)
    assert s.p_value == pytest.approx(math.exp(-h / 2), rel=1e-9) and s.p_value > 0.05  # no effect seen
    # 4 blocks, ranks 1 2 3 in each: sums 4 8 12 -> Q = 12 / (4 * 3 * 4) * 224 - 3 * 4 * 4 = 8
    assert s.friedman_q == pytest.approx(8.0, rel=1e-12)
    assert s.friedman_p == pytest.approx(math.exp(-4.0), rel=1e-9)
    assert s.kendall_w == pytest.approx(1.0)


def test_friedman_needs_three_rows():
    two = [record(row, control, value) for row, values in list(VALUES.items())[:2]
           for control, value in enumerate(values)]
    s = metric_statistic(two, "valid_loss")
    assert math.isnan(s.friedman_q) and math.isnan(s.friedman_p) and not math.isnan(s.h)


def test_beam_bleu_spreads_scale_with_the_values():
    s = metric_statistic(RECORDS, "bleu_beam")  # 2 x valid_loss: both spreads double, the ranks stay
    assert (s.within, s.between) == (pytest.approx(2.0), pytest.approx(6.0))
    assert s.h == pytest.approx(7.2)


def test_rows_that_do_not_differ_test_as_not_different():
    # each row has the same three values: rank sums equal, H 0
    same = [record(row, control, value) for row in "ABC" for control, value in enumerate((1.0, 2.0, 3.0))]
    s = metric_statistic(same, "valid_loss")
    assert s.h == pytest.approx(0.0, abs=1e-12) and s.p_value == pytest.approx(1.0)
    assert s.between == pytest.approx(0.0, abs=1e-12) and s.within == pytest.approx(1.0)


def test_identical_shares_between_rows_and_within_a_row():
    records = [record("A", 0, 1, ("x", "y")), record("A", 1, 1, ("x", "y")),
               record("B", 0, 1, ("x", "z")), record("B", 1, 1, ("q", "z"))]
    between, within = identical_shares(records, 4)
    # control 0: A vs B share 1/2; control 1: A vs B share 0 -> mean 1/4
    assert between == pytest.approx(0.25)
    # A's control 1 vs its control 0: 1; B's: 1/2 -> mean 3/4
    assert within == pytest.approx(0.75)


def test_the_table_shows_every_measure():
    table = study_table(RECORDS)
    assert "9 runs: 3 rows, 1 seeds, 2 controls each" in table
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in table.splitlines() if line.startswith("| ")}
    assert lines["valid loss (SD)"][:3] == ["3.0000", "1.0000", "3.00"]
    assert lines["valid loss (SD)"][3] == "7.200"
    assert lines["valid loss (SD)"][6] == "6.000" and lines["valid loss (SD)"][8] == "1.000"
    assert lines["identical translations (beam 4)"][:2] == ["100.0%", "100.0%"]


def test_one_row_is_no_test():
    with pytest.raises(ValueError, match="at least two rows"):
        metric_statistic([record("A", 0, 1.0), record("A", 1, 2.0)], "valid_loss")
    with pytest.raises(ValueError, match="metric must be one of"):
        metric_statistic(RECORDS, "chrf")


def test_one_run_per_row_is_no_test():
    """Each row a single run: Kruskal-Wallis would rank one value per group (H = k - 1, whatever
    the values), and a row's spread with itself is unknown; refused by name, not printed as p."""
    with pytest.raises(ValueError, match=r"at least two runs of each row .*, got 1 of A, B, C"):
        metric_statistic([record("A", 0, 1.0), record("B", 0, 2.0), record("C", 0, 3.0)], "valid_loss")
    with pytest.raises(ValueError, match=r"at least two runs of each row .*, got 1 of B"):
        metric_statistic([record("A", 0, 1.0), record("A", 1, 1.5), record("B", 0, 2.0)], "valid_loss")
