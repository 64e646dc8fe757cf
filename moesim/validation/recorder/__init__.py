"""The torch recorder: an expert-parallel MoE layer run under torch.profiler (needs the
``torch`` extra, imported only when called). See :mod:`moesim.validation`."""
