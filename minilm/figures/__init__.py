"""Figures: what each position scheme does (``positions``), what a model attends to
(``attention``) and which keys each layer type of a layer design sees (``layers``). matplotlib
is optional (the ``plot`` extra)."""
