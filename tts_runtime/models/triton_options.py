"""The compile options every Triton kernel of tts is launched with.

Triton 3.9 warns on each process's first compile when FMA fusion is left to its default, and
3.10 turns that default off. tts's kernels were checked on the H100 and for register spills
(evals/kernel_resources.py) with fusion on, so every launch, and the offline compile, asks
for it rather than follow whichever default the installed Triton has.
"""

LAUNCH_OPTIONS = {"enable_fp_fusion": True}
