# ---- tensor nodes: the Python operations recorded as single OP_NODE entries ----
# (included by _core.pyx before tape.pxi and sweep.pxi, whose mixed sweep reads these
# fields in C)

@cython.final
@cython.freelist(256)
@cython.auto_pickle(False)     # a node holds Python callables: lists with nodes do not pickle
cdef class Node:
    """A tensor operation's tape entry (an OP_NODE): the entry indices it read (-1: a
    constant) and ``vjp(g)``, one adjoint contribution per input (array, float or None).

    ``graph(tape, index, g)`` is the same vjp written with recorded operations, for
    ``create_graph=True``: ``g`` is the adjoint as a Tensor (a Record or float for a node
    with a scalar output), ``index`` the node's own entry; it returns one contribution per
    input (Tensor, Record, float or None) that can be differentiated again. None: the
    operation has no second derivative here (the sweep says so), unless ``vjp`` is an
    ElementwiseStep, whose ``graph`` method is then used (the dispatch makes no bound
    method per operation).
    ``scalar_output``: the entry's adjoint is a float; ``retain``: the sweep keeps this
    node's adjoint for ``d[t]`` (inputs, nodes without inputs, always keep theirs).

    A sweep that releases (``lst._backward_from(handle, seed, release=True)``, as
    ``ad.grad``, ``ad.value_and_grad`` and ``ad.vjp`` sweep their own lists) sets ``vjp``
    and ``graph`` of every node with inputs it passes to a function that raises
    RuntimeError, dropping what they saved (the operands' values) there and then; a later
    sweep that reaches such a node raises instead of reading stale data.

    Examples
    --------
    >>> import easyad as ad
    >>> from easyad._core import Node
    >>> lst = ad.WengertList()
    >>> x = lst.variable(3.0)
    >>> y = lst._push_node(Node("twice", (x.index,), lambda g: (2.0 * g,),
    ...                         scalar_output=True), 6.0)
    >>> y.derivatives()[x]
    2.0
    """

    cdef public object label
    cdef public tuple inputs
    cdef public object vjp
    cdef public object graph
    cdef public bint scalar_output
    cdef public bint retain

    def __init__(self, label, inputs, vjp, bint scalar_output=False, graph=None):
        self.label = label
        self.inputs = inputs if type(inputs) is tuple else tuple(inputs)
        self.vjp = vjp
        self.graph = graph
        self.scalar_output = scalar_output
        self.retain = False

    def __repr__(self):
        return f"<node {self.label} inputs={self.inputs}>"
