"""Closed-loop evaluation in simulation: the simulators a trained policy is rolled out in (`libero/`)."""
