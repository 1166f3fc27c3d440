"""The hccc compiler: front ends, verifier, scheduler, lowering, ProgramIR and code generation."""
