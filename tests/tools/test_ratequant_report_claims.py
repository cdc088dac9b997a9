#!/usr/bin/env python3
"""tools/ratequant_report.py: a claim "A has lower perplexity than B" holds only
beyond the seed spread (paired per-seed differences when both rows ran the same
seeds, else the combined sd); inside it the verdict says so instead of
'holds' / 'does not hold'. Hand-computed cases, including the 2026-12 SmolLM2
numbers (RateQuant over KIVI 15.16 vs the uniform split 14.67, deterministic)."""
import math
import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))
import ratequant_report  # noqa: E402


def row(ppl, seeds=None):
    return {"ppl": ppl, "seeds": list(range(len(ppl))) if seeds is None else seeds}


class Claims(unittest.TestCase):
    def test_paired_spread(self):
        # Differences b − a per seed: 0.5, 0.1, 0.3 → mean 0.3, sd 0.2: holds.
        v, d, s = ratequant_report.claim_verdict(row([10.0, 11.0, 12.0]), row([10.5, 11.1, 12.3]))
        self.assertEqual(v, "holds")
        self.assertAlmostEqual(d, 0.3)
        self.assertAlmostEqual(s, 0.2)
        # Differences 0.5, −0.4, 0.2 → mean 0.1, sd ≈ 0.46: within the spread (a bare comparison said "holds").
        v, d, s = ratequant_report.claim_verdict(row([10.0, 11.0, 12.0]), row([10.5, 10.6, 12.2]))
        self.assertEqual(v, "within the seed spread")
        self.assertAlmostEqual(s, math.sqrt(((0.4) ** 2 + (0.5) ** 2 + (0.1) ** 2) / 2))
        # Reversed and beyond the spread: does not hold.
        v, _, _ = ratequant_report.claim_verdict(row([10.5, 11.1, 12.3]), row([10.0, 11.0, 12.0]))
        self.assertEqual(v, "does not hold")

    def test_unpaired_and_deterministic(self):
        # Different seeds: combined sd sqrt(sd_a² + sd_b²) = sqrt(0.5 + 0.5) = 1 against a difference of 0.5.
        v, d, s = ratequant_report.claim_verdict(row([10.0, 11.0], [0, 1]), row([10.5, 11.5], [2, 3]))
        self.assertEqual(v, "within the seed spread")
        self.assertAlmostEqual(s, 1.0)
        # Two deterministic rows (one run each, sd 0): any difference is beyond the spread.
        v, d, s = ratequant_report.claim_verdict(row([15.16]), row([14.67]))
        self.assertEqual(v, "does not hold")
        self.assertEqual(s, 0.0)
        self.assertAlmostEqual(d, -0.49)
        # One seeded row against a deterministic one: the seeded row's sd is the spread.
        v, _, s = ratequant_report.claim_verdict(row([14.0, 14.4, 14.2]), row([14.3]))
        self.assertAlmostEqual(s, 0.2)
        self.assertEqual(v, "within the seed spread")


if __name__ == "__main__":
    unittest.main()
