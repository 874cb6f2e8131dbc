"""recap: the RECAP offline-RL pipeline (returns, value model, advantages, CFG policy).

Importing ``recap`` is cheap and side-effect free: it imports neither torch nor TensorFlow.
"""

__version__ = "0.1.0"
