"""FPGA board definitions, wrappers, constraints and vendor project scripts. Arrives with
the boards issue."""
