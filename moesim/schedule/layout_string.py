"""Which layers each (virtual) pipeline stage holds: Megatron-Core's
``pipeline_model_parallel_layout`` strings, ``decoder_first/last_pipeline_num_layers``, or
moesim's even split (pure; docs/schedules.md, "Pipeline layouts").

Layout strings (megatron/core/transformer/pipeline_parallel_layer_layout.py,
``PipelineParallelLayerLayout.parse_str_to_list``, NVIDIA/Megatron-LM d98e8a6): stages are
separated by ``|``; ``E`` the embedding, ``t`` a decoder (transformer) layer, ``m`` an MTP
layer, ``L`` the loss (final norm, output layer, cross-entropy); ``x*n`` repeats one
character, ``(...)*n`` a group; commas are cosmetic. ``Et*3|(tt|)*29m|L`` is
``Ettt|tt|...|tt|m|L``: 32 stages. Stage i is virtual stage i = chunk·pp + pipeline rank
(Megatron's 1-D layout order), so the string has pp·vpp stages.

Megatron's rules (``validate_layer_layout``): the first piece is E, the last L, each
once; as many t as decoder layers and m as MTP layers; no t after an m. moesim's step
programs put the embedding on virtual stage 0 and the loss on the last one, so E must
open stage 0 and L close the last stage. Decoder layers take indices 0..layers-1 in
stage order, MTP layers layers..layers+mtp-1.

``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers``
(transformer_block.py ``get_num_layers_to_build``): the first / last pipeline rank holds
that many layers, the others share the rest evenly (it must divide), and with
interleaving each rank's layers split evenly over its vpp chunks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from moesim.errors import InputError

PIECES = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
FIELD = "parallel.pipeline_layout"


def split_layers(n_layers: int, pp: int) -> list[range]:
    """moesim's even split: contiguous layers per (virtual) stage; a remainder goes one
    each to stages 1, 2, ... (stage 0 already holds the embedding)."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for stage in range(pp):
        size = base + (1 if 1 <= stage <= extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def stage_chunks(scn, spec, n_stages: int, dual: bool = False) -> list[range]:
    """Layer indices (decoders, then MTP layers) of each of ``n_stages`` virtual stages
    of a scenario: its ``parallel.pipeline_layout``, else its decoder_first/last split,
    else the even split with the MTP layers at the end of the last stage."""
    par, src = scn.parallel, scn.source
    layout = getattr(par, "pipeline_layout", None)
    first = getattr(par, "decoder_first_pipeline_num_layers", None)
    last = getattr(par, "decoder_last_pipeline_num_layers", None)
    mtp = spec.mtp_layers
    # DualPipe's P stages (rank r holds r and P-1-r) take decoder_first/last as Megatron's
    # first/last stage; a layout string, or DualPipeV's V of 2P stages, is refused
    uneven_dual = (dual and layout is None and getattr(scn.schedule, "kind", "") == "dualpipe")
    if (layout is not None or first is not None or last is not None) and dual \
            and not uneven_dual:
        raise InputError(src, FIELD if layout is not None else
                         "parallel.decoder_first_pipeline_num_layers",
                         "gpipe, 1f1b, interleaved or (first/last only) dualpipe",
                         layout if layout is not None else first)
    if layout is not None:
        if first is not None or last is not None:
            raise InputError(src, FIELD, "either a layout or decoder_first/last_pipeline_"
                             "num_layers, not both", layout)
        return layout_chunks(layout, layers=spec.layers, mtp=mtp, n_stages=n_stages,
                             source=src)
    if first is not None or last is not None:
        pp = par.pp
        chunks = uneven_chunks(spec.layers, pp, 1 if dual else n_stages // pp, first, last,
                               src)
    else:
        chunks = split_layers(spec.layers, n_stages)
    return with_mtp(chunks, spec.layers, mtp)


#: the longest layout string :func:`parse_layout` unrolls (each step, groups then single
#: pieces): 2^20 characters, far above any model's layers + pp·vpp stages (DeepSeek-V3's
#: 32-stage layout unrolls to 95); a count such as 10^12 asked for a terabyte string
MAX_LAYOUT_CHARS = 2**20
_REPEATS = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")


def expand(text: str, limit: int | None = None) -> str:
    """Unroll ``(...)*n`` and then ``x*n`` as Megatron does; commas dropped. Each step's
    length is worked out before the string is built: over ``limit`` characters (a count
    of 10^12 would ask for a terabyte) raises :class:`OverflowError` holding it."""
    s = text.replace(",", "")
    for pattern in _REPEATS:
        if limit is not None:
            n = len(s) + sum(len(m.group(1)) * _count(m.group(2)) - len(m.group(0))
                             for m in re.finditer(pattern, s))
            if n > limit:
                raise OverflowError(n)
        s = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), s)
    return s


def _count(digits: str) -> int:
    """A repeat count; one too long to be read as a number (over 18 digits) as 2^62."""
    return int(digits) if len(digits) <= 18 else 2**62


def _shown(text: str) -> str:
    """A layout string as an error shows it: its first 80 characters."""
    return text if len(text) <= 80 else text[:77] + "..."


def _size(n: int) -> str:
    return f"{n:,}" if n < 10**18 else "over 10^18"


def parse_layout(text: str, source: str = "<layout>") -> list[str]:
    """The stages of a layout string, each a string over E, t, m, L. Its length is
    worked out before it is unrolled: over :data:`MAX_LAYOUT_CHARS` it is refused."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(source, FIELD, "a Megatron layout string such as 'Et*3|(tt|)*29m|L'",
                         text)
    try:
        stages = expand(text.strip(), MAX_LAYOUT_CHARS).split("|")
    except OverflowError as big:
        raise InputError(source, FIELD, f"a layout that unrolls to at most "
                         f"{MAX_LAYOUT_CHARS:,} characters (E, L, one t or m per layer, "
                         f"| between stages; this one: {_size(big.args[0])})",
                         _shown(text)) from None
    for st in stages:
        bad = set(st) - set(PIECES)
        if bad:
            raise InputError(source, FIELD, "stages of E (embedding), t (decoder layer), "
                             "m (MTP layer), L (loss) separated by |, with x*n and (...)*n",
                             _shown(text))
    return stages


def layout_chunks(text: str, *, layers: int, mtp: int, n_stages: int,
                  source: str = "<layout>") -> list[range]:
    """Layer indices of each virtual stage (decoders 0.., then MTP layers from
    ``layers``) for a layout string of ``n_stages`` = pp·vpp stages."""
    stages = parse_layout(text, source)
    flat = "".join(stages)

    def need(cond: bool, expected: str) -> None:
        if not cond:
            raise InputError(source, FIELD, expected, _shown(text))

    need(len(stages) == n_stages, f"{n_stages} stages (pp·vpp; this one has {len(stages)})")
    need(flat.count("E") == 1 and stages[0].startswith("E"),
         "E (the embedding) once, opening the first stage")
    need(flat.count("L") == 1 and stages[-1].endswith("L"),
         "L (the loss) once, closing the last stage")
    need(flat.count("t") == layers, f"{layers} t, the model's decoder layers (this one has "
         f"{flat.count('t')})")
    need(flat.count("m") == mtp, f"{mtp} m, model.mtp_layers (this one has {flat.count('m')})")
    need("t" not in flat[flat.find("m"):] if "m" in flat else True,
         "every m (MTP layer) after the last t (Megatron: decoder layers before MTP)")
    out, dec, extra = [], 0, layers
    for st in stages:
        nt, nm = st.count("t"), st.count("m")
        # with an m in the stage its t's are the model's last (no t after an m), so the
        # decoders end at ``layers`` where the MTP indices begin: one contiguous range
        out.append(range(dec, dec + nt) if not nm else range(dec if nt else extra, extra + nm))
        dec += nt
        extra += nm
    return out


def uneven_chunks(layers: int, pp: int, vpp: int, first: int | None, last: int | None,
                  source: str = "<layout>") -> list[range]:
    """Megatron's decoder_first/last_pipeline_num_layers split, as virtual stages."""
    counts = [None] * pp
    rest, left = layers, pp
    for rank, n, name in ((0, first, "decoder_first_pipeline_num_layers"),
                          (pp - 1, last, "decoder_last_pipeline_num_layers")):
        if n is not None:
            if n < 0 or n > rest or (pp == 1):
                raise InputError(source, f"parallel.{name}", f"0..{rest} layers with pp > 1",
                                 n)
            counts[rank] = n
            rest -= n
            left -= 1
    if left > 0:
        if rest % left:
            raise InputError(source, "parallel.decoder_first_pipeline_num_layers",
                             f"to leave layers the {left} other stages share evenly "
                             f"({rest} left)", first)
        counts = [rest // left if c is None else c for c in counts]
    elif rest:
        raise InputError(source, "parallel.decoder_last_pipeline_num_layers",
                         f"first + last = the model's {layers} layers with pp 2", last)
    for rank, c in enumerate(counts):
        if c % vpp:
            raise InputError(source, "parallel.vpp", f"a divisor of each stage's layers "
                             f"(stage {rank}: {c})", vpp)
    out: list[range] = [range(0)] * (pp * vpp)
    start = 0
    for chunk in range(vpp):
        for rank in range(pp):
            n = counts[rank] // vpp
            out[chunk * pp + rank] = range(start, start + n)
            start += n
    return out


def with_mtp(chunks: Sequence[range], layers: int, mtp: int) -> list[range]:
    """The default MTP placement: after the last decoder layer, in the last stage."""
    out = list(chunks)
    if mtp:
        last = out[-1]
        out[-1] = range(last.start if len(last) else layers, layers + mtp)
    return out
