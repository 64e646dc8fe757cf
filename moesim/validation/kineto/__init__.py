"""The Kineto (torch.profiler) JSON format shared by CPU and GPU traces: events, ranks,
and the cost of an op from its recorded shapes. See :mod:`moesim.validation`."""
