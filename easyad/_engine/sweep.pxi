# The backward sweep of a WengertList with tensor nodes (included after tape.pxi): scalar
# stretches in C, tensor nodes' vjps (core steps' in C, others through Python), adjoints
# accumulated and released as the sweep passes. Apart from the list itself because it is
# the one place the scalar and tensor engines meet.

# ---- the backward sweep (module-level: WengertList's cdef methods are declared in
# _core.pxd; these take the extra ``release`` switch) ----

cdef Derivatives _sweep_from(WengertList lst, Py_ssize_t output, object seed, bint release):
    cdef Py_ssize_t n = output + 1
    cdef double* adjoints = <double*>calloc(n, sizeof(double))
    if adjoints == NULL:
        raise MemoryError(f"cannot allocate {n} adjoints for a backward sweep")
    cdef Derivatives d = Derivatives.__new__(Derivatives)
    d._adjoints = adjoints
    d._length = n
    d.tape = lst
    d.generation = lst.generation
    if lst._node_order and lst._node_order[0] <= output:
        _sweep_nodes(lst, d, output, seed, release)
        return d
    adjoints[output] = 1.0 if seed is None else <double>seed
    lst._sweep_range(adjoints, 0, output)
    return d


def _released_vjp(*args):
    """What a released node's vjp and graph become (a sweep with release=True passed it)."""
    raise RuntimeError(_RELEASED)


_RELEASED = ("this tensor operation's saved values were released by an earlier backward "
             "sweep that released them as it passed (release=True, as ad.grad, "
             "ad.value_and_grad and ad.vjp sweep their own lists), so the list cannot be "
             "swept through it again; record the computation again for another sweep")


cdef int _sweep_nodes(WengertList lst, Derivatives d, Py_ssize_t output, object seed,
                      bint release) except -1:
    # Scalar runs between nodes sweep in C; each node (a tensor operation) passes its
    # adjoint on through node.vjp(). Tensor adjoints live in d._node_adjoints.
    # ``release``: every node with inputs the sweep passes gives up its vjp and graph (and
    # so the values they saved) once passed; a later sweep that reaches it raises.
    cdef double* adjoints = d._adjoints
    cdef dict tensor_adjoints = {}
    cdef dict nodes = lst._nodes
    cdef list order = lst._node_order
    cdef Py_ssize_t k, hi = output, inp, j, m
    cdef Node node, other
    cdef tuple inputs
    cdef object g, c, previous, contributions, vjp
    # adjoints this sweep made for slices to add into in place (entry -> its array)
    cdef dict owned = {}
    d._node_adjoints = tensor_adjoints
    found = nodes.get(output)
    if found is not None and not (<Node>found).scalar_output:
        if seed is None:
            raise ValueError("the backward sweep from a tensor needs a seed (an array of "
                             "its shape); take the derivatives of a scalar, e.g. t.sum()")
        tensor_adjoints[output] = seed
    else:
        adjoints[output] = 1.0 if seed is None else float(seed)
    for j in range(len(order) - 1, -1, -1):
        k = order[j]
        if k > output:
            continue
        if k < hi:
            lst._sweep_range(adjoints, k + 1, hi)
        hi = k - 1
        node = <Node>nodes[k]
        inputs = node.inputs
        if node.scalar_output:
            g = adjoints[k] if adjoints[k] != 0.0 else None
        elif not inputs or node.retain:
            # inputs (nodes without inputs) keep their adjoint for d[t]; intermediate
            # tensors give theirs up once passed on, so memory stays bounded
            g = tensor_adjoints.get(k)
        else:
            g = tensor_adjoints.pop(k, None)
        if owned:       # nothing reaches k any more: its buffer is no longer ours
            owned.pop(k, None)
        if g is not None:
            vjp = node.vjp
            if vjp is _released_vjp:
                raise RuntimeError(f"entry {k} of {lst!r} ({node.label}): {_RELEASED}")
            if type(vjp) is KeySliceStep and not _anomaly_mode and \
                    _slice_into(lst, tensor_adjoints, owned, <KeySliceStep>vjp, inputs, g):
                contributions = ()      # added in place already
            elif type(vjp) is ElementwiseStep:     # the commonest node: its kernels from C
                contributions = (<ElementwiseStep>vjp).adjoints(g)
            elif isinstance(vjp, _CoreStep):     # sum, getitem, matmul...: from C too
                contributions = (<_CoreStep>vjp).adjoints(g)
            else:
                contributions = vjp(g)
            vjp = None
            g = None
            if _anomaly_mode:
                _service("anomaly.check_node")(lst, k, node, contributions)
            m = 0
            for c in contributions:
                if m >= len(inputs):
                    break
                inp = <Py_ssize_t>inputs[m]
                m += 1
                if c is None or inp < 0:
                    continue
                if lst._ops[inp] == OP_NODE:
                    other = <Node>nodes[inp]
                    if not other.scalar_output:
                        previous = tensor_adjoints.get(inp)
                        tensor_adjoints[inp] = c if previous is None else previous + c
                        previous = None     # the partial sum is dropped, not held here
                        continue
                adjoints[inp] += <double>c
            contributions = None
        if release and inputs:
            node.vjp = _released_vjp
            node.graph = _released_vjp
    if hi >= 0:
        lst._sweep_range(adjoints, 0, hi)
    return 0


cdef bint _slice_into(WengertList lst, dict tensor_adjoints, dict owned, KeySliceStep step,
                      tuple inputs, object g) except -1:
    """getitem's adjoint added in place at its key into the operand's adjoint, when that is
    an array this sweep made for it (zeros at the first slice): a loop over ``x[t]`` costs
    one array of x's shape, not one per step. False (nothing done) where the general path
    must run: another device, another dtype, an operand that is not a tensor node, an
    adjoint made elsewhere of another dtype."""
    cdef Py_ssize_t inp
    if not inputs or type(step.be) is not _numpy_backend or type(g) is not _NDARRAY or \
            (<cnp.ndarray>g).dtype is not step.dtype:
        return False
    inp = <Py_ssize_t>inputs[0]
    if inp < 0 or lst._ops[inp] != OP_NODE or (<Node>lst._nodes[inp]).scalar_output:
        return False
    previous = tensor_adjoints.get(inp)
    buf = owned.get(inp)
    if buf is None or buf is not previous:
        if previous is None:
            buf = _tracked(step.be, _empty(step.shape, step.dtype, True))
        elif type(previous) is _NDARRAY and (<cnp.ndarray>previous).dtype is step.dtype \
                and previous.shape == step.shape:
            buf = _tracked(step.be, previous.copy())
        else:
            return False
        owned[inp] = buf
        tensor_adjoints[inp] = buf
    view = buf[step.key]
    view += g
    return True
