"""The parts of the recorded functions that ``ad.record`` returns.

``easyad.replay`` holds ``ad.record``, the scalar ``Function`` and ``ad.load``;
``easyad._recorded`` holds the tensor ``TensorFunction``. Each class is assembled from the
parts here, one concern per module, so that no file has to hold a whole class:

- ``rows``: how a scalar Function runs rows (the VM or compiled code, threads, branch
  changes, error statuses): what every evaluating method goes through;
- ``hessians``: the scalar Function's Hessians and Hessian-vector products (sparsity,
  colouring, the second-order program, the sweeps);
- ``compiling``: ``Function.compile`` and the bound gradient call;
- ``devices``: a scalar Function's gradients on OpenCL (``compiler/tape/render_cl.py``);
- ``files``: the ``Function.save`` file format and its validating reader;
- ``tensor_recording``: what a TensorFunction records (its programs and their slots);
- ``tensor_inputs``: how a TensorFunction checks and places the inputs of a call;
- ``tensor_batches``: a TensorFunction over a batch of points.

The package imports nothing at its own import: its modules sit below the two classes.
"""
