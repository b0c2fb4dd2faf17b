"""Training and calibration of the early-exit artefacts: collected hidden states, translators,
the exit classifier, the stop rule, LITE fine-tuning, the PPO exit agent, threshold calibration."""
