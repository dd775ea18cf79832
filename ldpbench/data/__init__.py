"""Datasets: registry (official files, checksums, preparation), download/mirror, prepared form."""
