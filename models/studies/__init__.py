"""The experiments, apart from the training loop they use: each a design, its jobs and its page."""
