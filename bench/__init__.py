"""
The IOP benchmark harness: IOP vs calling the upstream directly vs the LiteLLM proxy (1 and 2
workers), side by side in one run on one machine against the same fake upstreams, streamed and
whole answers, so that machine noise cancels in the ratios; per run, the figures that carry
across machines (CPU per request and per streamed chunk, added latency) beside the performance
goals. ``python -m bench --help`` (or ``make bench`` / ``make bench-smoke``).
"""
