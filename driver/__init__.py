"""hccc: a compiler for collective-communication algorithms on heterogeneous GPU clusters."""
__version__ = "0.1.0"
