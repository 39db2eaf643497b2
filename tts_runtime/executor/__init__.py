"""The device side of the engine: everything that holds device memory and runs forwards."""
