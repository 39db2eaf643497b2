"""tts's C++ CPU kernels (csrc/): how they are built and cached (cpu_extensions.py) and the
Python side of each: paged attention, layer ops, streamed bf16 projections."""
