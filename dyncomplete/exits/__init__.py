"""Exit heads, exit policies, their training and calibration."""
