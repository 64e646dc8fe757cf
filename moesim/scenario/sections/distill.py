"""The ``distill:`` scenario section (knowledge distillation, docs/distillation.md):
:class:`DistillSection`, checked when the scenario is read. The teacher is built and
checked against the student (same vocabulary, ``k`` at most the vocabulary, a layout
that divides its GPUs, weights that fit) when the section is run
(:func:`moesim.distill.setup.distill_setup`).

```yaml
distill:
  teacher: qwen3-235b-a22b        # a preset name, or a model section {preset: ..., layers: ...}
  placement: separate             # colocated (the student's GPUs, in series) | separate
  teacher_gpus: 16                # separate: the teacher's own GPUs (whole nodes)
  teacher_tp: 4                   # the teacher's tensor parallel (vocabulary-sharded head)
  teacher_ep: 16                  # the teacher's expert parallel
  outputs: topk                   # logits (the full vocabulary) | topk
  k: 64                           # topk: (value, index) pairs per token
  logit_dtype: bf16               # bytes of a transferred logit value: bf16 2, fp32 4
  temperature: 1.0                # the loss's temperature: changes no time
```

Every problem is one :class:`~moesim.errors.InputError` naming the file and the
``distill.`` field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from moesim.errors import InputError
from moesim.model.read import ModelSection
from moesim.model.read import parse as parse_model
from moesim.scenario.sections import as_written

PLACEMENTS = ("colocated", "separate")
OUTPUTS = ("logits", "topk")
#: bytes per transferred logit value (the index of a top-k pair is an int32: 4 bytes)
LOGIT_BYTES = {"bf16": 2, "fp32": 4}
#: what one machine simulates: GPUs of a teacher pool, pairs per token
MAX_GPUS = 100_000
MAX_K = 10_000_000


@dataclass(frozen=True)
class DistillSection:
    teacher: ModelSection = dataclasses.field(default_factory=ModelSection)
    placement: str = "colocated"
    teacher_gpus: int | None = None     # separate: its own GPUs (colocated: the student's)
    teacher_tp: int = 1
    teacher_ep: int = 1
    outputs: str = "topk"
    k: int = 64
    logit_dtype: str = "bf16"
    temperature: float = 1.0

    @property
    def value_bytes(self) -> int:
        return LOGIT_BYTES[self.logit_dtype]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _teacher(v: Any, src: str) -> ModelSection:
    """A preset name or a model section; its errors name ``distill.teacher.FIELD``."""
    d = {"preset": v} if isinstance(v, str) else v
    if not isinstance(d, dict) or not d:
        raise InputError(src, "distill.teacher", "a model preset name or a model section "
                         "({preset: NAME} or dims)", v)
    try:
        return parse_model(d, src)
    except InputError as err:
        field = err.field.removeprefix("model.").removeprefix("model")
        if isinstance(v, str) and field == "preset":
            field = ""
        raise InputError(src, "distill.teacher" + (f".{field}" if field else ""),
                         *err.args[2:]) from None


def _check(src: str, key: str, v: Any) -> Any:
    rules = {
        "placement": (lambda: v in PLACEMENTS, f"one of {list(PLACEMENTS)}"),
        "outputs": (lambda: v in OUTPUTS, f"one of {list(OUTPUTS)}"),
        "logit_dtype": (lambda: v in LOGIT_BYTES, f"one of {list(LOGIT_BYTES)}"),
        "teacher_gpus": (lambda: v is None or (_is_int(v) and 1 <= v <= MAX_GPUS),
                         f"an integer from 1 to {MAX_GPUS:,} (or omit it)"),
        "teacher_tp": (lambda: _is_int(v) and 1 <= v <= MAX_GPUS,
                       f"an integer from 1 to {MAX_GPUS:,}"),
        "teacher_ep": (lambda: _is_int(v) and 1 <= v <= MAX_GPUS,
                       f"an integer from 1 to {MAX_GPUS:,}"),
        "k": (lambda: _is_int(v) and 1 <= v <= MAX_K,
              "an integer >= 1 (top-k pairs per token, at most the vocabulary)"),
        "temperature": (lambda: isinstance(v, int | float) and not isinstance(v, bool)
                        and math.isfinite(v) and v > 0, "a finite number > 0"),
    }
    ok, expected = rules[key]
    if not ok():
        raise InputError(src, f"distill.{key}", expected, v)
    return v


def distill_from_dict(d: Any, source: str) -> DistillSection | None:
    """Check the ``distill`` section against itself (None: no section)."""
    if not d:
        return None
    if not isinstance(d, dict):
        raise InputError(source, "distill", "a mapping of key: value", d)
    valid = [f.name for f in dataclasses.fields(DistillSection)]
    kwargs: dict[str, Any] = {}
    for k, v in d.items():
        if k not in valid:
            raise InputError(source, f"distill.{k}", f"one of the distill keys {valid}", k)
        kwargs[k] = _teacher(v, source) if k == "teacher" else _check(source, k, v)
    if "teacher" not in kwargs:
        raise InputError(source, "distill.teacher", "the teacher model: a preset name or a "
                         "model section")
    cfg = DistillSection(**kwargs)
    if cfg.placement == "separate" and cfg.teacher_gpus is None:
        raise InputError(source, "distill.teacher_gpus", "the teacher's own GPUs with "
                         "placement separate, an integer >= 1")
    if cfg.placement == "colocated" and cfg.teacher_gpus is not None:
        raise InputError(source, "distill.teacher_gpus", "unset with placement colocated "
                         "(the teacher runs on the student's GPUs)", cfg.teacher_gpus)
    return as_written(cfg, d)


def summary_dict(cfg: DistillSection) -> dict:
    """The checked section as the distillation summary echoes it (the teacher as
    written)."""
    out = dataclasses.asdict(cfg)
    out["teacher"] = cfg.teacher.as_dict()
    return out
