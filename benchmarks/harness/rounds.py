"""Alternated rounds (every method once per round, so that the machine's phases fall on all alike),
medians, and ratios taken within each round."""

import statistics


def alternate(measures, rounds, report=None):
    """measures: {name: callable()}, run in order, round after round. Returns {name: [result of each
    round]}; report(round_, name, result) is called after each measurement (round_ counts from 1)."""
    out = {name: [] for name in measures}
    for round_ in range(1, rounds + 1):
        for name, measure in measures.items():
            result = measure()
            out[name].append(result)
            if report:
                report(round_, name, result)
    return out


def median(values):
    return statistics.median(list(values))


def medians(per_round):
    """{name: [values]} -> {name: median}."""
    return {name: median(values) for name, values in per_round.items()}


def column(per_round, index):
    """{name: [tuples]} -> {name: [tuple[index]]}: one of several quantities each round measured."""
    return {name: [value[index] for value in values] for name, values in per_round.items()}


def ratios(numerators, denominators):
    """Each round's ratio: numerator and denominator measured in the same round."""
    return [n / d for n, d in zip(numerators, denominators)]


def spread(values, unit="", digits=3):
    """'median 0.532 (rounds 0.586, 0.607, ...)'."""
    return f"median {median(values):.{digits}f}{unit} (rounds " + ", ".join(f"{v:.{digits}f}" for v in values) + ")"
