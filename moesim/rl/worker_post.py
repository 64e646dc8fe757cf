"""NeMo RL v0.3's generation worker after vLLM returns: the host loop that copies each
generated token's log-probability into a tensor (``rl.rollout.post_process: nemo-v03``).

NeMo RL v0.3.0 (NVIDIA-NeMo/RL b1c86a816) asks vLLM for the sampled token's log-prob
(``SamplingParams(logprobs=0)``, nemo_rl/models/generation/vllm.py:421-431), so vLLM
0.9.0's output processor returns one ``{token_id: Logprob}`` dict per generated token
(vllm/v1/engine/logprobs.py ``LogprobsProcessor._update_sample_logprobs``: ``logprobs``
is a list whenever ``num_logprobs`` is not None, 0 included). After ``self.llm.generate``
returns, each vLLM worker (``VllmGenerationWorker.generate``, vllm.py:496-545) loops over
its samples and, inside, over every generated token::

    sequence_length = input_lengths[i]            # a 0-d tensor: no .item()
    for idx, logprob_dict in enumerate(generation.logprobs):
        if logprob_dict:
            position = sequence_length + idx      # a tensor op on a 0-d tensor
            full_logprobs[position] = next(iter(logprob_dict.items()))[1].logprob

Per token: one scalar tensor op and one element assignment from Python, each at
PyTorch's per-call overhead:

- the element assignment, :data:`SETITEM_S`: PyTorch's indexing benchmark ``v[0] = 1``,
  7.04 us (pytorch/pytorch PR 32841's table, quoted in PR 45828; 7.33 us before it);
- the scalar op, :data:`SCALAR_OP_S`: ``y = 2*x`` on a one-element tensor, 1,000,000
  calls in about 5 s with ``requires_grad=False`` (pytorch/pytorch issue 41383).

The worker returns its results only after the loop, and ``VllmGeneration.generate``
waits for every worker (``get_all_worker_results``), so a replica's generation ends at
its last sample's last token plus the loop over all its samples' tokens
(:func:`moesim.rl.generate.generate`). Left out (no published per-call cost that fits,
or bounded small): the per-sample ops around the loop (``torch.full``, ``torch.zeros``,
two slice copies, ``torch.tensor`` of the token list: a few ops a sample, under 0.05 s
for 256 samples at these rates), the Python iteration itself, ``torch.stack`` of the
padded rows, the results' trip through Ray to the driver, and the driver's
``tokenizer.batch_decode`` of every response (nemo_rl/experience/rollouts.py).
Cross-check, not used: this loop measured 11.1 us a token on a 2-core Xeon with
torch 2.13 (CPU build), 4.9 us for the assignment alone.
"""

from __future__ import annotations

import numpy as np

from moesim.rl.step_wrap import StepCostsWrapper

#: seconds of one element assignment from Python, ``v[0] = 1``: pytorch/pytorch PR 32841's
#: indexing benchmark (its "New" column, as quoted in PR 45828)
SETITEM_S = 7.04e-6
#: seconds of one op on a one-element tensor from Python: pytorch/pytorch issue 41383,
#: ``y = 2*x`` 1,000,000 times in about 5 s with ``requires_grad=False``
SCALAR_OP_S = 5e-6
#: seconds per generated token of NeMo RL v0.3's log-prob copy loop (module docstring)
PER_TOKEN_S = SETITEM_S + SCALAR_OP_S

#: ``rl.rollout.post_process`` -> seconds per generated token
POSTS = {"none": 0.0, "nemo-v03": PER_TOKEN_S}


def post_s(tokens: int, name: str = "nemo-v03") -> float:
    """Seconds one worker's loop takes over ``tokens`` generated tokens."""
    return POSTS[name] * max(int(tokens), 0)


def per_replica_s(response, replica, replicas: int, name: str = "nemo-v03") -> np.ndarray:
    """Each replica's loop: the tokens of its samples (``replica[i]`` holds sample ``i``
    of ``response[i]`` tokens) at :func:`post_s`."""
    tokens = np.bincount(np.asarray(replica, dtype=np.int64),
                         weights=np.asarray(response, dtype=float), minlength=replicas)
    return np.array([post_s(int(t), name) for t in tokens], dtype=float)


class PostProcessCosts(StepCostsWrapper):
    """A rollout engine's step costs (:class:`moesim.traffic.step_costs.StepCosts`
    ``inner``) that also say what the worker spends after its last step
    (:meth:`worker_post_s`; :class:`moesim.rl.generate.Rollout` reads it). Steps are ``inner``'s."""

    def __init__(self, inner, name: str = "nemo-v03") -> None:
        if name not in POSTS:
            raise ValueError(f"post_process {name!r}: one of {sorted(POSTS)}")
        self.inner, self.name = inner, name

    def worker_post_s(self, response, replica, replicas: int) -> np.ndarray:
        """Per replica, the seconds after its last sample's last token."""
        return per_replica_s(response, replica, replicas, self.name)
