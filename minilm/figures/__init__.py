"""Figures: what each position scheme does (``positions``) and what a model attends to
(``attention``). matplotlib is optional (the ``plot`` extra)."""
