"""ldpbench: reproducible benchmark campaigns for LDP mechanisms in federated learning."""

__version__ = "0.1.0"
