# Replay: a recorded WengertList run as a program at new points, without Python in the loop.
# One row of X at a time: a forward sweep recomputes every value and partial from the
# opcodes, then reverse sweeps give gradients and Jacobians; forward-over-reverse (tangents
# of the partials, also rendered from the table) gives Hessian-vector products and
# Hessians. Rows run in C without the GIL, split over threads by easyad/replay.py.
#
# The list is laid out again once per Function (_build_program): the entries that compute
# nothing (inputs) first, then the computing ones reordered, dependencies kept, into runs
# of one opcode. The forward sweep dispatches once per run and loops over contiguous
# entries (easyad_rule_eval_run, rendered from the table); the reverse sweep walks entries
# that do not depend on each other back to back. A loop in the user's code (the terms of a
# sum) becomes a few long runs instead of one switch per entry.
#
# Its parts, included in this order by _core.pyx: program (the layout's data), schedule,
# layout (building it), sweeps, replayer (the Python class).

cdef enum:
    _WHAT_VALUE = 0
    _WHAT_GRADIENT = 1      # reverse sweep from each output: Jacobian rows
    _WHAT_SECOND = 2        # H @ S for K seed directions (first output)
    _STATUS_NO_SECOND = 5   # a user primitive without d2f met a second-order sweep
                            # (1-4 and 7 are the rules' statuses, _status.h)
    _STATUS_PYTHON = 6      # a user primitive raised
    _RUN_ONE_BY_ONE = 0     # run_op of a run of structural entries (select, comparison, custom)
    _SPECIAL_SQUARE = 1     # an affine pow run whose exponent is the constant 2.0: x * x


cdef struct _Program:
    # The recorded list laid out again (positions, not the list's indices); owns its arrays
    Py_ssize_t length
    uint8_t* ops
    int32_t* arg0            # operand positions; -1: none, or a constant held in partial0/1
    int32_t* arg1
    double* values           # recorded values (variables that are not inputs keep theirs)
    double* partial0
    double* partial1
    int32_t* slot0           # operand slots for the sweeps: a position, or length + c for
    int32_t* slot1           # constants[c] (slot length: 0.0, the absent operand of unary rules)
    Py_ssize_t n_constants
    double* constants
    int32_t* original        # position -> index in the recorded list (errors, guards, customs)
    int32_t* position        # index in the recorded list -> position
    Py_ssize_t first         # positions first.. compute (before: inputs and other variables)
    Py_ssize_t n_runs
    int32_t* run_start       # run r: positions run_start[r] .. run_start[r + 1]
    uint8_t* run_op          # the run's opcode, or _RUN_ONE_BY_ONE
    uint8_t* run_need        # bit 0: operand 0 is recorded (its partial is needed), bit 1: operand 1
    uint8_t* run_affine      # 0: operands by slot; else operand k of entry start + j is at
    int32_t* run_base0       # run_base_k + j * stride_k, stride_k = bit k+1 (1, or 0 for one slot)
    int32_t* run_base1
    uint8_t* run_special     # 0, or a kernel of the VM's own for this affine run (_SPECIAL_*)
    uint8_t* run_dead        # 1: a gradient alone needs none of the run's values (sums and
                             # differences only feeding sums, differences and no output)
    int32_t* inputs          # positions
    Py_ssize_t n_inputs
    int32_t* outputs
    Py_ssize_t n_outputs
    void* customs            # the list's dict of user primitives (borrowed), or NULL


cdef struct _Rows:
    # per row: outputs (B, m) | gradients (B, m, n) | second (B, n, K) and their seeds (B?, n, K)
    const double* X
    double* out
    double* jac
    double* second
    const double* seeds
    Py_ssize_t seeds_stride  # 0: the same seeds for every row
    Py_ssize_t K
    uint8_t* changed         # per row: a guard's outcome differs
    int32_t* guard           # per row: the first guard that differs (-1: none), list index
    int32_t* status          # per row: an error code (0: none)
    int32_t* status_entry    # per row: the list index of the entry that raised


cdef void _free_program(_Program* P) noexcept nogil:
    free(P.ops)
    free(P.arg0)
    free(P.arg1)
    free(P.values)
    free(P.partial0)
    free(P.partial1)
    free(P.slot0)
    free(P.slot1)
    free(P.constants)
    free(P.original)
    free(P.position)
    free(P.run_start)
    free(P.run_op)
    free(P.run_need)
    free(P.run_affine)
    free(P.run_base0)
    free(P.run_base1)
    free(P.run_special)
    free(P.run_dead)
    free(P.inputs)
    free(P.outputs)
    memset(P, 0, sizeof(_Program))
