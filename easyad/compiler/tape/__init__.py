"""The scalar tape's compiler (``Function.compile``): optimiser, second-order builder, C renderer,
loader of the built library."""
