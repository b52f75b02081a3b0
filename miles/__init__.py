"""miles: a compact RL post-training framework (PPO, GRPO, REINFORCE++) with a safe async driver."""

__version__ = "0.1.0"
