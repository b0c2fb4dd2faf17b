"""Early exit at run time: exit heads, exit policies, the classifier, the agent and the stop rule's
classifier, and the one way their trained artefacts are stored. Training lives in `training`."""
