"""
The IOP benchmark harness: IOP vs calling the upstream directly vs the LiteLLM proxy, side by
side in one run on one machine against one fake upstream, so that machine noise cancels in the
ratios. ``python -m bench --help`` (or ``make bench`` / ``make bench-smoke``).
"""
