"""The Runtime: co-hosts the generator and the PRM on one device and one memory budget (phases, overlap, the vLLM backend)."""
