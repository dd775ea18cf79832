"""The federated engine: models and the FedSGD round loop."""
