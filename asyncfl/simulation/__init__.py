"""Simulation: delay models, scenario presets, comparison of runs."""
