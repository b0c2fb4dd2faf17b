"""GREEN-CODE's exit agent: a small policy network, trained with PPO on precomputed hidden states,
that reads an exit layer's hidden state and decides "continue" or "exit" (threshold T at run time)."""
