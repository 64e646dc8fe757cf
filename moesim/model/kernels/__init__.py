"""The kernels of a transformer layer, pass by pass, as the reference implementations
launch them (issue 21; docs/kernels.md).

- :mod:`~moesim.model.kernels.make`: one GEMM in a pass (forward, dgrad, wgrad) with
  its shape, layout and dtype, and one memory-bound kernel with the bytes it moves;
- :mod:`~moesim.model.kernels.linear`: a Linear layer's kernels in a pass, FP8
  quantisation and transposed copies included when the GEMMs run in FP8;
- :mod:`~moesim.model.kernels.attention`: attention (MHA/GQA, MLA) projections, rotary
  embedding, flash attention forward and backward, the MLA latent norms;
- :mod:`~moesim.model.kernels.moe`: router, permutation around the exchange, routed
  experts (grouped GEMMs, one expert's share each), shared experts and dense FFNs.

:mod:`moesim.model.costs` assembles them into the op kernel lists the programs price.
"""
