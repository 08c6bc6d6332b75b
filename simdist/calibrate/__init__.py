"""Calibration: microbenchmarks and executor runs fitted into a CalibrationProfile."""
