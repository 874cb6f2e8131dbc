"""What feeds a model: the processor saved beside its weights (``processor.json``).

``Pi05Processor`` (``pi05``) and ``ValueProcessor`` (``value``) hold everything between a raw
frame or observation and model tensors: prompt style, camera slots (``cameras``: the one slot
rule), image resize (``transforms``), the normalization formula and its statistics
(``normalize``, ``norm_stats``). Training data, Step 3, evaluation, collection and serving all
build their inputs through them. Below ``models`` and ``data``: it imports neither.
"""
