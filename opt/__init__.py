"""The learning math: LSTM policy, GAE and PPO losses (pure functions), experience buffer, learner step."""
