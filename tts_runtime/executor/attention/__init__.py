"""Paged attention: the backend interface and the torch backend (attention.py), the plan the
kernels share (attention_plan.py), the triton kernels (triton_attention.py) and the choice
between them (backends.py)."""
