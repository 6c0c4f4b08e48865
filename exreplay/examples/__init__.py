"""Runnable examples: python -m exreplay.examples.apex_cartpole (Ape-X DQN on Ray)."""
