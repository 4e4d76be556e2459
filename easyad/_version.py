"""easyad's version, in a module of its own so the layers below the package can read it
(the compile cache keys on it) without importing the package."""
__version__ = "0.1.0"
