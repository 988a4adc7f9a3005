"""
Tests for :mod:`iop.usage.price`: a request's exact cost from its reported usage, and the worst
case an admission reserves.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from iop.config.model import Price
from iop.formats.usage import anthropic_usage, openai_chat_usage
from iop.runtime.events import Usage
from iop.usage.price import WorstCase, cost_micros, format_micros, worst_case

# Claude Sonnet's list price per million tokens: 3 in, 15 out, 0.30 cache reads, 3.75 writes.
SONNET = Price(
    input=3_000_000,
    output=15_000_000,
    cached_input=300_000,
    cache_write=3_750_000,
    reasoning=15_000_000,
)
# An o-series price with reasoning priced apart (for the test's sake: dearer than output).
REASONER = Price(
    input=1_100_000,
    output=4_400_000,
    cached_input=275_000,
    cache_write=1_100_000,
    reasoning=8_800_000,
)


class CostTests(SynchronousTestCase):
    def test_plain(self) -> None:
        """1M input + 1M output at 3/15 is exactly 18 currency units."""
        self.assertEqual(cost_micros(Usage(1_000_000, 1_000_000), SONNET), 18_000_000)
        self.assertEqual(cost_micros(Usage(1000, 500), SONNET), 3000 * 1 + 7500)

    def test_cached_reads_at_their_price(self) -> None:
        """The prompt's cached part is priced ``cached_input``, the rest ``input``."""
        usage = Usage(input_tokens=10_000, output_tokens=0, cached_input_tokens=9_000)
        # 1000 * 3 + 9000 * 0.3 = 3000 + 2700 micros
        self.assertEqual(cost_micros(usage, SONNET), 5_700)
        # Not 30_000, as pricing the whole prompt at the input price would say.
        self.assertNotEqual(cost_micros(usage, SONNET), cost_micros(Usage(10_000, 0), SONNET))

    def test_cache_writes_at_their_price(self) -> None:
        usage = Usage(input_tokens=4_000, output_tokens=0, cache_write_tokens=4_000)
        self.assertEqual(cost_micros(usage, SONNET), 15_000)

    def test_anthropic_report_exactly(self) -> None:
        """
        Anthropic's own report, read as IOP reads it: 12 uncached, 2087 written, 14016 read,
        310 out → 12*3 + 2087*3.75 + 14016*0.3 + 310*15 = 36 + 7826.25 + 4204.8 + 4650
        = 16717.05 micros → 16717.
        """
        usage = anthropic_usage(
            {
                "input_tokens": 12,
                "cache_creation_input_tokens": 2087,
                "cache_read_input_tokens": 14016,
                "output_tokens": 310,
            }
        )
        self.assertEqual(cost_micros(usage, SONNET), 16_717)

    def test_reasoning_is_part_of_output(self) -> None:
        """
        OpenAI's ``completion_tokens`` include the reasoning tokens: 1000 out of which 800
        reasoning is 200 at output and 800 at reasoning, not 1800 tokens.
        """
        usage = openai_chat_usage(
            {
                "prompt_tokens": 100,
                "completion_tokens": 1000,
                "completion_tokens_details": {"reasoning_tokens": 800},
                "prompt_tokens_details": {"cached_tokens": 0},
            }
        )
        expected = 100 * 1_100_000 + 200 * 4_400_000 + 800 * 8_800_000
        self.assertEqual(cost_micros(usage, REASONER), (expected + 500_000) // 1_000_000)

    def test_reasoning_defaults_to_output(self) -> None:
        """With ``reasoning`` equal to ``output`` (the default), the split changes nothing."""
        split = Usage(0, 1000, reasoning_tokens=700)
        self.assertEqual(cost_micros(split, SONNET), cost_micros(Usage(0, 1000), SONNET))

    def test_every_kind_at_once(self) -> None:
        price = Price(input=1, output=10, cached_input=100, cache_write=1000, reasoning=10_000)
        usage = Usage(
            input_tokens=1_000_000 + 2_000_000 + 3_000_000,
            cached_input_tokens=2_000_000,
            cache_write_tokens=3_000_000,
            output_tokens=4_000_000 + 5_000_000,
            reasoning_tokens=5_000_000,
        )
        self.assertEqual(cost_micros(usage, price), 1 + 200 + 3000 + 40 + 50_000)

    def test_rounded_half_up_once_at_the_end(self) -> None:
        """
        Each token kind's share may be a fraction of a micro-unit; they are summed exactly and
        rounded once. 1 token at 0.3/M is 0.3 micros; five kinds of it sum to 1.5 → 2 (half up),
        where rounding each part first would say 0.
        """
        price = Price(300_000, 300_000, 300_000, 300_000, 300_000)
        self.assertEqual(cost_micros(Usage(1, 0), price), 0)
        five = Usage(
            input_tokens=3,
            output_tokens=2,
            cached_input_tokens=1,
            cache_write_tokens=1,
            reasoning_tokens=1,
        )
        self.assertEqual(cost_micros(five, price), 2)
        self.assertEqual(cost_micros(Usage(5, 0), Price(100_000, 0, 0, 0, 0)), 1)  # 0.5 → 1
        self.assertEqual(cost_micros(Usage(4, 0), Price(100_000, 0, 0, 0, 0)), 0)  # 0.4 → 0

    def test_unknown_is_none_never_invented(self) -> None:
        self.assertIsNone(cost_micros(Usage(10, 10), None))
        self.assertIsNone(cost_micros(None, SONNET))
        self.assertIsNone(cost_micros(None, None))

    def test_free_model(self) -> None:
        self.assertEqual(cost_micros(Usage(10**9, 10**9), Price(0, 0, 0, 0, 0)), 0)

    def test_zero_usage(self) -> None:
        self.assertEqual(cost_micros(Usage(), SONNET), 0)

    def test_inconsistent_report_priced_as_reported(self) -> None:
        """More cached than prompt, more reasoning than output: each part at its price, the
        remainder never negative."""
        usage = Usage(input_tokens=10, output_tokens=5, cached_input_tokens=20, reasoning_tokens=8)
        price = Price(
            input=1_000_000, output=1_000_000, cached_input=1, cache_write=1, reasoning=2_000_000
        )
        self.assertEqual(cost_micros(usage, price), (20 * 1 + 8 * 2_000_000 + 500_000) // 10**6)

    def test_large_counts_stay_exact(self) -> None:
        """Python integers: a trillion tokens at a fine price is still exact."""
        usage = Usage(10**12, 10**12, cached_input_tokens=10**12 - 1)
        price = Price(1, 1, 1, 1, 1)
        self.assertEqual(cost_micros(usage, price), (3 * 10**12 - 10**12 + 500_000) // 10**6)


counts = st.integers(min_value=0, max_value=10**9)
prices = st.builds(
    Price,
    input=st.integers(0, 10**9),
    output=st.integers(0, 10**9),
    cached_input=st.integers(0, 10**9),
    cache_write=st.integers(0, 10**9),
    reasoning=st.integers(0, 10**9),
)


class WorstCaseTests(SynchronousTestCase):
    def test_tokens_and_cost(self) -> None:
        self.assertEqual(worst_case(1000, 500, SONNET), WorstCase(1500, 3750 + 7500))
        self.assertEqual(worst_case(1000, 500, None), WorstCase(1500, None))

    def test_rounded_up(self) -> None:
        self.assertEqual(worst_case(1, 0, Price(1, 1, 1, 1, 1)).cost_micros, 1)
        self.assertEqual(worst_case(0, 0, SONNET).cost_micros, 0)

    def test_negative_counts_are_zero(self) -> None:
        self.assertEqual(worst_case(-5, -1, SONNET), WorstCase(0, 0))

    @given(
        prices,
        counts,
        counts,
        st.data(),
    )
    def test_never_below_the_reported_cost(
        self, price: Price, prompt: int, output: int, data: st.DataObject
    ) -> None:
        """Any usage within the reserved counts costs at most the worst case."""
        cached = data.draw(st.integers(0, prompt))
        written = data.draw(st.integers(0, prompt - cached))
        reasoning = data.draw(st.integers(0, output))
        usage = Usage(
            input_tokens=prompt,
            output_tokens=output,
            cached_input_tokens=cached,
            cache_write_tokens=written,
            reasoning_tokens=reasoning,
        )
        actual = cost_micros(usage, price)
        bound = worst_case(prompt, output, price)
        assert actual is not None and bound.cost_micros is not None
        self.assertLessEqual(actual, bound.cost_micros)
        self.assertEqual(bound.tokens, prompt + output)


class FormatTests(SynchronousTestCase):
    def test_exact_decimal(self) -> None:
        self.assertEqual(format_micros(16_717), "0.016717")
        self.assertEqual(format_micros(18_000_000), "18.000000")
        self.assertEqual(format_micros(0), "0.000000")
