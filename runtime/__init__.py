"""hccc runtime: reference executor, simulator, emulation and GPU back ends."""
