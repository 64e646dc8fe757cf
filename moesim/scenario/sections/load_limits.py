"""What one machine simulates: the bounds on every count and size of a ``load:`` section
(each refusal names its limit).

The event loop keeps every request (about 1 KB each) and serves some 100 to 1,000
requests per CPU second on a large EP deployment (docs/serving.md).
"""

MAX_REQUESTS = 1_000_000        # requests per run (also rate_rps x duration_s)
MAX_TOKENS = 10_000_000         # tokens of one prompt or output: beyond any model's context
RATE_RPS = (1e-6, 1e6)          # arrival rate, requests/s
CV = (1e-3, 100.0)              # gamma gaps' coefficient of variation (shape 1/cv^2)
MAX_DURATION_S = 1e7            # seconds of arrivals (116 days)
MAX_SIGMA = 10.0                # lognormal sigma of the log
MAX_GRID = 65_536               # requests or prompts per rank at a surface point
MAX_GRID_POINTS = 64            # values per surface axis
INT_LIMITS = {"token_budget": MAX_TOKENS, "max_seqs": 1_000_000, "block_size": 4096,
              "prefill_groups": 100_000, "kv_tokens": 10**10, "seed": 2**63 - 1}
