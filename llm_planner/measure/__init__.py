"""Measured against predicted: run observations, comparisons and calibration of a spec."""
