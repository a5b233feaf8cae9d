"""The scheduler: one maintenance service per concern, built in ``sweepers.py``, run by ``python -m scheduler``."""
