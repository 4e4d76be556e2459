"""Higher-order reverse mode: the backward sweep recorded on the tape itself.

``z.derivatives(create_graph=True)`` walks the WengertList from ``z`` down like the C sweep,
but the adjoints are Records: each contribution ``partial * adjoint`` is computed with the
rule table's partial expressions evaluated on the operands' Records (``_expressions``), so
it appends entries to the same list and ``d[x]`` can be differentiated again, to any order.
"""
from __future__ import annotations

from typing import Any

from easyad import _core
from easyad._core import ElementwiseStep, Record, WengertList, _CoreStep
from easyad._expressions import _mul0, derivative_rules
from easyad._tapeview import CUSTOM, NODE, SELECT, TapeView
from easyad.errors import StaleRecordError, TapeMismatchError

# the core's steps, whose nodes leave graph None: the step's method is the graph
_CORE_STEPS = (ElementwiseStep, _CoreStep)



def _add(a: Any, b: Any) -> Any:
    return b if a is None else a + b


def backward_graph(z: Record, seed: float = 1.0, stop: int = 0) -> GraphDerivatives:
    # stop: entries below it are not expanded (their adjoints are collected): a node's
    # recorded vjp sweeps only what it recorded (transforms/checkpoint.py)
    tape = z.tape
    if tape is None:
        return GraphDerivatives(None, {}, 0)
    view = TapeView(tape)  # a snapshot: the sweep appends to the list as it goes
    compiled = derivative_rules()    # plain-number partials as the sweeps: NaN, no raise
    adjoints: dict[int, Any] = {z.index: seed}
    for i in range(z.index, stop - 1, -1):
        g = adjoints.get(i)
        if g is None or (isinstance(g, float) and g == 0.0):
            continue
        kind = view.kind(i)
        if not view.passes_derivative(i):
            continue
        a, b = view.operand(i, 0), view.operand(i, 1)
        if kind == SELECT:
            j = view.operand(i, view.taken(i))
            if j >= 0:
                adjoints[j] = _add(adjoints.get(j), g)
            continue
        if kind == NODE:
            node = tape._node(i)
            if not node.inputs:         # a tensor input: its adjoint stays for d[t]
                continue
            graph = node.graph
            if graph is None and isinstance(node.vjp, _CORE_STEPS):   # the core's steps
                graph = node.vjp.graph
            if graph is None:
                raise NotImplementedError(
                    f"create_graph=True cannot differentiate through the tensor operation "
                    f"{node.label!r} again: it has no recorded vjp (for a custom array "
                    f"operation, write its vjp with easyad operations and pass "
                    f"differentiable=True to ad.primitive/ad.define, or use vjp='numeric')")
            for j, c in zip(node.inputs, graph(tape, i, g)):
                if j >= 0 and c is not None:
                    adjoints[j] = _add(adjoints.get(j), c)
            continue
        x = tape._record_at(a) if a >= 0 else view.constant(i, 0)
        y = tape._record_at(b) if b >= 0 else view.constant(i, 1)
        if kind == CUSTOM:
            partials = tape._custom(i)._partial_records(x, y)
        else:
            rule = compiled[view.name(i)]
            y_arg = y if rule.rule.arity == 2 else 0.0
            out = tape._record_at(i)
            # only the partials of recorded operands: the one of a constant exponent would
            # need log(x), which fails for a negative base
            partials = tuple(p(x, y_arg, out) if j >= 0 else 0.0
                             for p, j in zip(rule.partials, (a, b)))
        for j, partial in zip((a, b), partials):
            if j >= 0:
                adjoints[j] = _add(adjoints.get(j), _mul0(partial, g))
    return GraphDerivatives(tape, adjoints, tape.generation)


class GraphDerivatives:
    """The result of a recorded backward sweep: ``d[x]`` is a Record (differentiable)."""

    def __init__(self, tape: WengertList | None, adjoints: dict[int, Any], generation: int):
        self.tape = tape
        self._adjoints = adjoints
        self._generation = generation

    def _check(self) -> None:
        if self.tape is not None and self.tape.generation != self._generation:
            raise StaleRecordError(f"these derivatives were recorded on {self.tape!r} before "
                                   f"it was cleared; run the sweep again")

    def _as_record(self, value: Any) -> Record:
        if isinstance(value, Record):
            return value
        return Record.constant(0.0 if value is None else float(value))

    def __getitem__(self, x: Any) -> Any:
        lookup = getattr(x, "_graph_derivative", None)
        if lookup is not None:          # a Tensor: its adjoint as a recorded Tensor
            self._check()
            return lookup(self)
        if not isinstance(x, Record):
            raise TypeError(f"index derivatives with a Record or Tensor, "
                            f"not {type(x).__name__}")
        self._check()
        if x.tape is None:
            return Record.constant(0.0)
        if self.tape is None:
            return Record.constant(0.0)
        if x.tape is not self.tape:
            raise TapeMismatchError(f"derivatives on {self.tape!r} looked up with a Record of "
                                    f"{x.tape!r}; use Records of the same WengertList")
        return self._as_record(self._adjoints.get(x.index))

    def _adjoint(self, index: int) -> Any:
        """The recorded adjoint of entry ``index`` (a Record, Tensor or float), or None."""
        return self._adjoints.get(index)

    def wrt(self, x: Any) -> Any:
        return self[x]

    def by_name(self, name: str) -> Record:
        self._check()
        names = {} if self.tape is None else {v: k for k, v in self.tape._names_dict().items()}
        if name not in names:
            named = ", ".join(map(repr, names)) or "none"
            raise KeyError(f"no variable named {name!r} (named: {named})")
        return self._as_record(self._adjoints.get(names[name]))

    def as_dict(self) -> dict[str, Record]:
        self._check()
        if self.tape is None:
            return {}
        return {name: self._as_record(self._adjoints.get(i))
                for i, name in self.tape._names_dict().items()}

    def __repr__(self) -> str:
        return f"<GraphDerivatives on {self.tape!r}: Records, differentiable again>"


# z.derivatives(create_graph=True) in the core sweeps through this (it imports no layer
# above it)
_core._register_service("higher.backward_graph", backward_graph)
